// kiln/optim/adamw.hpp: Adam with decoupled weight decay (Loshchilov & Hutter 2019), one fused
// pass per parameter tensor.
//
// The arithmetic is that of torch::optim::AdamW, in its order:
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  [AMSGrad: v^ = max(v^, v)]
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// LibTorch's own AdamW runs that as about a dozen separate elementwise kernels, each reading and
// writing whole tensors; here every element is read and written once (28 bytes per fp32
// parameter: p, g, m, v read, p, m, v written), which is the floor `kiln bench optimizers`
// compares against. Parameters may be fp32 or bf16; the moments are fp32.
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

class adamw : public kiln::optim::fused_optimizer<adamw> {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "adamw";
  static constexpr bool elementwise_update = true;  // each element's update reads only its own state

  struct settings {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
    bool amsgrad = false;
    std::vector<std::string> no_decay;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule)", kiln::checks::positive);
      v.field("beta1", beta1, "decay of the first moment", kiln::checks::in_range_open(0.0, 1.0));
      v.field("beta2", beta2, "decay of the second moment", kiln::checks::in_range_open(0.0, 1.0));
      v.field("eps", eps, "added to the denominator", kiln::checks::positive);
      v.field("weight_decay", weight_decay, "decoupled weight decay", kiln::checks::non_negative);
      v.field("amsgrad", amsgrad, "keep the maximum of the second moment (AMSGrad)");
      v.field("no_decay", no_decay, kiln::optim::no_decay_help);
    }
  };

  explicit adamw(const settings& s) : fused_optimizer(s.lr, s.weight_decay, s.no_decay), settings_(s) {}

  double base_lr() const { return settings_.lr; }

  void init_state(kiln::optim::slot& s) const {
    auto zeros = [&] { return torch::zeros(s.param.sizes(), s.param.options().dtype(torch::kFloat32)); };
    s.state = {{"exp_avg", zeros()}, {"exp_avg_sq", zeros()}};
    if (settings_.amsgrad) s.state.emplace_back("max_exp_avg_sq", zeros());
  }

  // Compiled once, in kiln::kernels (kiln/detail/kernels.hpp).
  void update(kiln::optim::slot& s, const torch::Tensor& grad) const;

 private:
  settings settings_;
};

}  // namespace kiln::optim

#if KILN_KERNEL_DEFINITIONS
#include "kiln/optim/detail/adam_rule.hpp"

KILN_KERNEL_ENTRY void kiln::optim::adamw::update(kiln::optim::slot& s, const torch::Tensor& grad) const {
  const detail::adam_rule rule(lr(), s.weight_decay, settings_.beta1, settings_.beta2, settings_.eps,
                               static_cast<double>(s.step));
  if (!settings_.amsgrad) return apply_rule(rule, s, grad, s.field(0), s.field(1));
  apply_rule(
      [rule](auto& p, const auto& g, auto& m, auto& v, auto& v_max) {
        rule.moments(p, g, m, v);
        v_max = detail::vmax(v_max, v);
        rule.apply(p, m, v_max);
      },
      s, grad, s.field(0), s.field(1), s.field(2));
}
#endif
