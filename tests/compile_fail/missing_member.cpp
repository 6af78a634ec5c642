// A precision policy without scale(): the sentence names the axis and the member.
// expect: kiln: precision axis: policy is missing `torch::Tensor scale
#include <kiln/kiln.hpp>
struct half_done {
  using axis = kiln::axis::precision;
  static constexpr std::string_view kind = "half-done";
  struct settings {
    template <class V> void describe(V&) {}
  };
  explicit half_done(const settings&) {}
  struct scope {};
  scope autocast() const { return {}; }
  bool unscale_and_check(std::vector<torch::Tensor>&) { return true; }
  void update(bool) {}
};
int main() {
  kiln::trainer<half_done> trainer;
  (void)trainer;
}
