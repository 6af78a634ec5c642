// kiln/optim/adafactor.hpp: Adafactor (Shazeer & Stern 2018) with the formulas of PyTorch's
// torch.optim.Adafactor: a factored second moment for tensors of 2+ dimensions, so a m x n
// weight keeps m + n numbers of state instead of Adam's 2 m n.
//
// Step t of a parameter p with gradient G:
//   b2_t = 1 - t^decay (decay = -0.8);  rho_t = min(lr, 1 / sqrt(t));  a_t = max(eps2, RMS(p)) rho_t
//   p *= 1 - lr * wd
//   2+ dims: R = lerp(R, rowmean(G^2), 1 - b2_t), C = lerp(C, colmean(G^2), 1 - b2_t) over the
//            last two dims, V = R C / max(mean(R), eps1);   vectors: V = lerp(V, G^2, 1 - b2_t)
//   U = G / sqrt(max(V, eps1^2));  U /= max(1, RMS(U) / d)
//   [beta1 > 0: the paper's optional first moment, m = lerp(m, U, 1 - beta1), U = m]
//   p -= a_t U
// lr is the cap of the relative step size, as in PyTorch (default 1e-2), not an absolute step.
// The row and column statistics are reductions, so this rule runs as tensor ops rather than one
// fused pass; its cost is in `kiln bench optimizers`.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/detail/kernels.hpp"
#include "kiln/optim/fused_optimizer.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::optim {

class adafactor : public kiln::optim::fused_optimizer<adafactor> {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "adafactor";

  struct settings {
    double lr = 1e-2;
    double beta2_decay = -0.8;
    double beta1 = 0.0;
    double eps1 = 0.0;  // 0: the machine epsilon of fp32, as PyTorch's default
    double eps2 = 1e-3;
    double clip_threshold = 1.0;
    double weight_decay = 0.0;
    std::vector<std::string> no_decay;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "cap of the relative step size min(lr, 1/sqrt(t))", kiln::checks::positive);
      v.field("beta2_decay", beta2_decay, "second-moment decay 1 - t^beta2_decay (< 0)",
              [](double x) -> std::optional<std::string> {
                if (x < 0) return std::nullopt;
                return std::string("expected a value < 0");
              });
      v.field("beta1", beta1, "optional first moment (0 = none, the memory-lean default)",
              kiln::checks::in_range_open(0.0, 1.0));
      v.field("eps1", eps1, "floor of the second moment (0 = fp32 epsilon)", kiln::checks::non_negative);
      v.field("eps2", eps2, "floor of RMS(parameter) in the relative step size", kiln::checks::positive);
      v.field("clip_threshold", clip_threshold, "update clipping: RMS(update) at most this (d)", kiln::checks::positive);
      v.field("weight_decay", weight_decay, "decoupled weight decay", kiln::checks::non_negative);
      v.field("no_decay", no_decay, kiln::optim::no_decay_help);
    }
  };

  explicit adafactor(const settings& s)
      : fused_optimizer(s.lr, s.weight_decay, s.no_decay),
        settings_(s),
        eps1_(s.eps1 > 0 ? s.eps1 : std::numeric_limits<float>::epsilon()) {}

  double base_lr() const { return settings_.lr; }

  void init_state(kiln::optim::slot& s) const {
    const auto f32 = s.param.options().dtype(torch::kFloat32);
    s.state.clear();
    if (s.param.dim() >= 2) {
      auto row = s.param.sizes().vec(), col = s.param.sizes().vec();
      row.back() = 1;
      col[col.size() - 2] = 1;
      s.state = {{"row_var", torch::zeros(row, f32)}, {"col_var", torch::zeros(col, f32)}};
    } else {
      s.state = {{"variance", torch::zeros(s.param.sizes(), f32)}};
    }
    if (settings_.beta1 > 0) s.state.emplace_back("exp_avg", torch::zeros(s.param.sizes(), f32));
  }

  // Compiled once, in kiln::kernels (kiln/detail/kernels.hpp).
  void update(kiln::optim::slot& s, const torch::Tensor& grad_in) const;

 private:
  settings settings_;
  double eps1_;
};

}  // namespace kiln::optim

#if KILN_KERNEL_DEFINITIONS
KILN_KERNEL_ENTRY void kiln::optim::adafactor::update(kiln::optim::slot& s, const torch::Tensor& grad_in) const {
  const double t = static_cast<double>(s.step);
  const double one_minus_beta2 = std::pow(t, settings_.beta2_decay);
  const double rho = std::min(lr(), 1.0 / std::sqrt(t));
  auto param = s.param.scalar_type() == torch::kFloat32 ? s.param : s.param.to(torch::kFloat32);
  auto grad = grad_in.to(torch::kFloat32);
  const double numel = static_cast<double>(param.numel());
  const double alpha = std::max(settings_.eps2, param.norm().item<double>() / std::sqrt(numel)) * rho;
  if (s.weight_decay != 0) param.mul_(1.0 - lr() * s.weight_decay);

  torch::Tensor variance;
  if (param.dim() >= 2) {
    auto& row = s.field(0);
    auto& col = s.field(1);
    auto squared = grad * grad;
    row.lerp_(squared.mean(-1, /*keepdim=*/true), one_minus_beta2);
    col.lerp_(squared.mean(-2, /*keepdim=*/true), one_minus_beta2);
    variance = torch::matmul(row, col).div_(row.mean(-2, /*keepdim=*/true).clamp_min(eps1_));
  } else {
    auto& v = s.field(0);
    v.lerp_(grad * grad, one_minus_beta2);
    variance = v.clone();
  }
  auto update = variance.clamp_min_(eps1_ * eps1_).rsqrt_().mul_(grad);
  const double rms = update.norm().item<double>() / std::sqrt(numel);
  update.div_(std::max(1.0, rms / settings_.clip_threshold));
  if (settings_.beta1 > 0) {
    auto& m = s.state.back().second;
    m.lerp_(update, 1.0 - settings_.beta1);
    update = m;
  }
  param.add_(update, -alpha);
  if (!param.is_same(s.param)) detail::store_updated(s.param, s.compensation, param);
}
#endif
