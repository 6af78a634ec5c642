// kiln/precision/loss_scaler.hpp: dynamic loss scaling with the semantics of PyTorch's GradScaler.
//
// fp16 gradients underflow to zero below ~6e-8. Multiplying the loss by a large scale before
// backward keeps them representable; the gradients are divided by the same scale before the
// optimizer sees them (and before clipping). When any gradient is Inf/NaN the scale was too
// large: the step is skipped and the scale multiplied by backoff_factor (0.5). After
// growth_interval (2000) consecutive finite steps the scale grows by growth_factor (2).
// LibTorch has no C++ GradScaler and 1.13's fused AMP ops exist only for CUDA, so this class
// uses them on CUDA and plain tensor ops elsewhere; it is testable on CPU without fp16 autocast.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/io/state.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln {

struct loss_scaler_settings {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  template <class V>
  void describe(V& v) {
    v.field("init_scale", init_scale, "initial loss scale", kiln::checks::positive);
    v.field("growth_factor", growth_factor, "scale multiplier after growth_interval finite steps",
            [](double g) -> std::optional<std::string> {
              if (g > 1.0) return std::nullopt;
              return std::string("expected a value > 1");
            });
    v.field("backoff_factor", backoff_factor, "scale multiplier after a non-finite step", kiln::checks::in_range_open(0.0, 1.0));
    v.field("growth_interval", growth_interval, "consecutive finite steps before the scale grows", kiln::checks::positive);
  }
};

class loss_scaler {
 public:
  explicit loss_scaler(const loss_scaler_settings& s = {})
      : settings_(s), scale_(s.init_scale) {}

  double scale() const { return scale_; }
  std::int64_t growth_tracker() const { return growth_tracker_; }

  torch::Tensor scale(const torch::Tensor& loss) const { return loss * scale_; }

  // Divides every gradient by the scale in place; true when all of them are finite. This is
  // the one place a sharded run reduces the answer across ranks (the accelerator does it).
  bool unscale_and_check(std::vector<torch::Tensor>& params) const {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    for (auto& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    if (grads.empty()) return true;
    const double inverse = 1.0 / scale_;
    if (grads.front().is_cuda()) {
      auto found_inf = torch::zeros({1}, grads.front().options().dtype(torch::kFloat32));
      auto inv = torch::full({1}, inverse, grads.front().options().dtype(torch::kFloat32));
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv);
      return found_inf.item<float>() == 0.0f;
    }
    // CPU: one pass per gradient to unscale, one reduction per gradient to check, read once.
    auto all_finite = torch::ones({}, torch::kBool);
    for (auto& g : grads) {
      g.mul_(inverse);
      all_finite.logical_and_(torch::isfinite(g).all());
    }
    return all_finite.item<bool>();
  }

  // After the (rank-agreed) check: back off on overflow, grow after a run of finite steps.
  void update(bool all_finite) {
    if (!all_finite) {
      scale_ *= settings_.backoff_factor;
      growth_tracker_ = 0;
    } else if (++growth_tracker_ == settings_.growth_interval) {
      scale_ *= settings_.growth_factor;
      growth_tracker_ = 0;
    }
  }

  void save_state(state_dict& state, const std::string& prefix) const {
    state[prefix + "scale"] = scalar_tensor(scale_);
    state[prefix + "growth_tracker"] = scalar_tensor(growth_tracker_);
  }
  void load_state(const state_dict& state, const std::string& prefix) {
    scale_ = require(state, prefix + "scale").item<double>();
    growth_tracker_ = require(state, prefix + "growth_tracker").item<std::int64_t>();
  }

 private:
  loss_scaler_settings settings_;
  double scale_;
  std::int64_t growth_tracker_ = 0;
};

}  // namespace kiln
