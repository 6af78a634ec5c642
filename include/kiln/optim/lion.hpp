// kiln/optim/lion.hpp: Lion, EvoLved Sign Momentum (Chen et al. 2023), one fused pass per
// parameter tensor; one fp32 state tensor (half of AdamW's).
//
//   c = b1 m + (1 - b1) g;  p *= 1 - lr * wd;  p -= lr * sign(c);  m = b2 m + (1 - b2) g
//
// Every coordinate moves by exactly lr, so Lion wants a learning rate 3-10x smaller than
// AdamW's and a weight decay 3-10x larger (the paper's advice).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/detail/kernels.hpp"
#include "kiln/optim/detail/fused_loop.hpp"
#include "kiln/optim/fused_optimizer.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::optim {

class lion : public kiln::optim::fused_optimizer<lion> {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "lion";
  static constexpr bool elementwise_update = true;  // each element's update reads only its own state

  struct settings {
    double lr = 1e-4;
    double beta1 = 0.9;
    double beta2 = 0.99;
    double weight_decay = 0.0;
    std::vector<std::string> no_decay;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule); 3-10x below AdamW's", kiln::checks::positive);
      v.field("beta1", beta1, "interpolation of momentum and gradient for the update's sign",
              kiln::checks::in_range_open(0.0, 1.0));
      v.field("beta2", beta2, "decay of the momentum", kiln::checks::in_range_open(0.0, 1.0));
      v.field("weight_decay", weight_decay, "decoupled weight decay", kiln::checks::non_negative);
      v.field("no_decay", no_decay, kiln::optim::no_decay_help);
    }
  };

  explicit lion(const settings& s) : fused_optimizer(s.lr, s.weight_decay, s.no_decay), settings_(s) {}

  double base_lr() const { return settings_.lr; }

  void init_state(kiln::optim::slot& s) const {
    s.state = {{"exp_avg", torch::zeros(s.param.sizes(), s.param.options().dtype(torch::kFloat32))}};
  }

  // Compiled once, in kiln::kernels (kiln/detail/kernels.hpp).
  void update(kiln::optim::slot& s, const torch::Tensor& grad) const;

 private:
  settings settings_;
};

}  // namespace kiln::optim

#if KILN_KERNEL_DEFINITIONS
KILN_KERNEL_ENTRY void kiln::optim::lion::update(kiln::optim::slot& s, const torch::Tensor& grad) const {
  const float decay = static_cast<float>(1.0 - lr() * s.weight_decay), step = static_cast<float>(lr());
  const float b1 = static_cast<float>(settings_.beta1), one_minus_b1 = static_cast<float>(1.0 - settings_.beta1);
  const float b2 = static_cast<float>(settings_.beta2), one_minus_b2 = static_cast<float>(1.0 - settings_.beta2);
  apply_rule(
      [=](auto& p, const auto& g, auto& m) {
        const auto c = m * b1 + g * one_minus_b1;
        p = p * decay - step * detail::vsign(c);
        m = m * b2 + g * one_minus_b2;
      },
      s, grad, s.field(0));
}
#endif
