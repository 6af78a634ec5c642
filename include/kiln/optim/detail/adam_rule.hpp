// kiln/optim/detail/adam_rule.hpp: the per-element AdamW update that adamw (over fp32 moments)
// and adam8bit (over moments dequantized block by block) share, for vectors and scalars alike.
#pragma once

#include <cmath>
#include <type_traits>

#include "kiln/optim/detail/fused_loop.hpp"

namespace kiln::optim::detail {

// torch::optim::AdamW's arithmetic, in its order, for step t of one parameter.
struct adam_rule {
  float decay, b1, one_minus_b1, b2, one_minus_b2, step_size, sqrt_bc2, eps;

  adam_rule(double lr, double weight_decay, double beta1, double beta2, double epsilon, double t)
      : decay(static_cast<float>(1.0 - lr * weight_decay)),
        b1(static_cast<float>(beta1)),
        one_minus_b1(static_cast<float>(1.0 - beta1)),
        b2(static_cast<float>(beta2)),
        one_minus_b2(static_cast<float>(1.0 - beta2)),
        step_size(static_cast<float>(lr / (1.0 - std::pow(beta1, t)))),
        sqrt_bc2(static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)))),
        eps(static_cast<float>(epsilon)) {}

  // Moments first, then the parameter from the (possibly AMSGrad-maxed) second moment.
  template <class V>
  [[gnu::always_inline]] void moments(V& p, const V& g, V& m, V& v) const {
    p = p * decay;
    m = m * b1 + g * one_minus_b1;
    v = v * b2 + g * g * one_minus_b2;
  }
  template <class V>
  [[gnu::always_inline]] void apply(V& p, const V& m, const V& v) const {
    p = p - step_size * (m / (vsqrt(v) / sqrt_bc2 + eps));
  }
  template <class V>
  [[gnu::always_inline]] void operator()(V& p, const V& g, V& m, V& v) const {
    moments(p, g, m, v);
    apply(p, m, v);
  }
};

}  // namespace kiln::optim::detail
