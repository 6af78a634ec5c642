// kiln/optim/sgd.hpp: stochastic gradient descent with momentum, the default of the
// optimizer axis and the template for writing your own.
//
// Required members (kiln::optimizer_policy in kiln/concepts.hpp):
//   attach(named_parameters)   called once by prepare() with ("name", parameter) pairs, after
//                              sharding placed them (a sharded policy may hand a shard);
//   step(), zero_grad()        the update and the gradient reset;
//   set_lr(lr), base_lr()      the scheduler sets lr = base_lr() * factor(step) each step;
//   state_bytes()              bytes of optimizer state, for memory reports.
// Optional: save_state/load_state(state_dict, prefix) to survive a resume (kiln stores state by
// parameter name, see kiln/io/state.hpp).
#pragma once

#include <string_view>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/optim/detail/libtorch_optimizer.hpp"
#include "kiln/recipe/fields.hpp"

namespace kiln::optim {

struct sgd : detail::libtorch_optimizer<sgd, torch::optim::SGD, torch::optim::SGDParamState> {
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "sgd";

  struct settings {
    double lr = 0.1;
    double momentum = 0.9;
    double dampening = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule)", kiln::checks::positive);
      v.field("momentum", momentum, "momentum factor", kiln::checks::in_range_open(0.0, 1.0));
      v.field("dampening", dampening, "dampening of the momentum", kiln::checks::in_range(0.0, 1.0));
      v.field("weight_decay", weight_decay, "L2 penalty added to the gradient", kiln::checks::non_negative);
      v.field("nesterov", nesterov, "use Nesterov momentum");
    }
  };

  explicit sgd(const settings& s) : settings_(s) {}

  void attach(const detail::named_tensors& named) {
    build(named, torch::optim::SGDOptions(settings_.lr)
                     .momentum(settings_.momentum)
                     .dampening(settings_.dampening)
                     .weight_decay(settings_.weight_decay)
                     .nesterov(settings_.nesterov));
  }

  double base_lr() const { return settings_.lr; }

  template <class State, class F>
  static void for_each_field(State& st, F&& f) {
    f("momentum_buffer", st.momentum_buffer());
  }

 private:
  settings settings_;
};

}  // namespace kiln::optim
