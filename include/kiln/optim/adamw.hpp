// kiln/optim/adamw.hpp: Adam with decoupled weight decay (Loshchilov & Hutter 2019).
//
// Delegates the update to torch::optim::AdamW so results match LibTorch exactly; state is
// saved by parameter name. (A fused single-pass implementation replaces this later; the
// policy's settings and state names stay the same.)
#pragma once

#include <string_view>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/optim/detail/libtorch_optimizer.hpp"
#include "kiln/recipe/fields.hpp"

namespace kiln::optim {

struct adamw : detail::libtorch_optimizer<adamw, torch::optim::AdamW, torch::optim::AdamWParamState> {
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "adamw";

  struct settings {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
    bool amsgrad = false;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule)", kiln::checks::positive);
      v.field("beta1", beta1, "decay of the first moment", kiln::checks::in_range_open(0.0, 1.0));
      v.field("beta2", beta2, "decay of the second moment", kiln::checks::in_range_open(0.0, 1.0));
      v.field("eps", eps, "added to the denominator", kiln::checks::positive);
      v.field("weight_decay", weight_decay, "decoupled weight decay", kiln::checks::non_negative);
      v.field("amsgrad", amsgrad, "keep the maximum of the second moment (AMSGrad)");
    }
  };

  explicit adamw(const settings& s) : settings_(s) {}

  void attach(const detail::named_tensors& named) {
    build(named, torch::optim::AdamWOptions(settings_.lr)
                     .betas({settings_.beta1, settings_.beta2})
                     .eps(settings_.eps)
                     .weight_decay(settings_.weight_decay)
                     .amsgrad(settings_.amsgrad));
  }

  double base_lr() const { return settings_.lr; }

  template <class State, class F>
  static void for_each_field(State& st, F&& f) {
    f("exp_avg", st.exp_avg());
    f("exp_avg_sq", st.exp_avg_sq());
    f("max_exp_avg_sq", st.max_exp_avg_sq());
  }

 private:
  settings settings_;
};

}  // namespace kiln::optim
