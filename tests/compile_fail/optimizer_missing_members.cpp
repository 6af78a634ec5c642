// An optimizer with none of its axis's members: the first one missing is the one error.
// expect: kiln: optimizer axis: policy is missing `void attach
#include <kiln/kiln.hpp>
struct my_optimizer {
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "mine";
  struct settings {};
  explicit my_optimizer(const settings&) {}
};
int main() {
  kiln::trainer<my_optimizer> trainer;
  (void)trainer;
}
