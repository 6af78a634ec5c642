// An optimizer on kiln's public fused base that forgot its rule: one error, naming the member.
// expect: kiln: optimizer axis: a kiln::optim::fused_optimizer is missing `void update
#include <kiln/kiln.hpp>
class my_optimizer : public kiln::optim::fused_optimizer<my_optimizer> {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "mine";
  struct settings {
    double lr = 0.1;
    template <class V>
    void describe(V&) {}
  };
  explicit my_optimizer(const settings& s) : fused_optimizer(s.lr, 0.0, {}) {}
  double base_lr() const { return 0.1; }
  void init_state(kiln::optim::slot&) const {}
};
int main() {
  my_optimizer optimizer({});
  optimizer.step();
}
