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
// parameter name, see kiln/io/state.hpp); use_kahan_summation(bool) and compensations() for
// bf16-pure's Kahan-summed updates (fused_optimizer has both).
//
// kiln's optimizers get all of that from kiln::optim::fused_optimizer (public: yours can derive
// from it too, copied from this header into your namespace) and write only the rule: here
// that of torch::optim::SGD, in one pass per parameter tensor:
//   d = g + wd p;  buf = d (first step) or momentum buf + (1 - dampening) d;
//   d = nesterov ? d + momentum buf : buf;  p -= lr d
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/optim/detail/fused_loop.hpp"
#include "kiln/optim/fused_optimizer.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::optim {

class sgd : public kiln::optim::fused_optimizer<sgd> {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "sgd";
  static constexpr bool elementwise_update = true;  // each element's update reads only its own state

  struct settings {
    double lr = 0.1;
    double momentum = 0.9;
    double dampening = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
    std::vector<std::string> no_decay;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule)", kiln::checks::positive);
      v.field("momentum", momentum, "momentum factor", kiln::checks::in_range_open(0.0, 1.0));
      v.field("dampening", dampening, "dampening of the momentum", kiln::checks::in_range(0.0, 1.0));
      v.field("weight_decay", weight_decay, "L2 penalty added to the gradient", kiln::checks::non_negative);
      v.field("nesterov", nesterov, "use Nesterov momentum");
      v.field("no_decay", no_decay, kiln::optim::no_decay_help);
    }
  };

  explicit sgd(const settings& s) : fused_optimizer(s.lr, s.weight_decay, s.no_decay), settings_(s) {
    if (s.nesterov && (s.momentum <= 0 || s.dampening != 0))
      throw kiln::config_error("optimizer.nesterov: Nesterov momentum needs momentum > 0 and dampening = 0");
  }

  double base_lr() const { return settings_.lr; }

  void init_state(kiln::optim::slot& s) const {
    s.state.clear();
    if (settings_.momentum != 0)
      s.state = {{"momentum_buffer", torch::zeros(s.param.sizes(), s.param.options().dtype(torch::kFloat32))}};
  }

  void update(kiln::optim::slot& s, const torch::Tensor& grad) const {
    const float wd = static_cast<float>(s.weight_decay), step = static_cast<float>(lr());
    const float momentum = static_cast<float>(settings_.momentum);
    const float keep = static_cast<float>(1.0 - settings_.dampening);
    const bool first = s.step == 1, nesterov = settings_.nesterov;
    if (s.state.empty())
      return apply_rule([=](auto& p, const auto& g) { p = p - step * (g + wd * p); }, s, grad);
    apply_rule(
        [=](auto& p, const auto& g, auto& buf) {
          auto d = g + wd * p;
          buf = first ? d : buf * momentum + keep * d;
          d = nesterov ? d + momentum * buf : buf;
          p = p - step * d;
        },
        s, grad, s.field(0));
  }

 private:
  settings settings_;
};

}  // namespace kiln::optim
