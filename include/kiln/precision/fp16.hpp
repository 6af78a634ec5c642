// kiln/precision/fp16.hpp: float16 autocast with dynamic loss scaling (PyTorch's AMP recipe).
//
// fp16 has a 5-bit exponent: gradients underflow without loss scaling, so this policy pairs
// autocast(fp16) with kiln::loss_scaler (GradScaler's semantics: 2^16, x2 after 2000 finite
// steps, x0.5 and a skipped step on overflow; its state is saved and resumed). LibTorch 1.13's
// CPU autocast accepts only bfloat16 and its CPU fp16 matmuls are not implemented, so on a
// machine without CUDA this policy refuses to start instead of silently training in fp32.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/errors.hpp"
#include "kiln/precision/bf16.hpp"
#include "kiln/precision/loss_scaler.hpp"

namespace kiln::precision {

struct fp16 {
  using axis = kiln::axis::precision;
  static constexpr std::string_view kind = "fp16";
  static constexpr bool needs_cuda = true;  // the accelerator refuses a CPU device

  struct settings : loss_scaler_settings {};

  explicit fp16(const settings& s) : scaler_(s) {
    if (!torch::cuda::is_available())
      throw config_error(
          "precision.kind = \"fp16\" needs CUDA: this LibTorch's CPU autocast supports only bfloat16 and has no "
          "fp16 matmul on CPU; use kind = \"bf16\" (same memory saving, no loss scaling needed)");
  }

  // CUDA only: CPU ops stay fp32 rather than failing on fp16 kernels the CPU lacks.
  detail::device_autocast autocast() const { return detail::device_autocast(at::kHalf, /*cpu=*/false); }
  torch::Tensor scale(const torch::Tensor& loss) const { return scaler_.scale(loss); }
  bool unscale_and_check(std::vector<torch::Tensor>& params) { return scaler_.unscale_and_check(params); }
  void update(bool all_finite) { scaler_.update(all_finite); }

  void save_state(kiln::state_dict& state, const std::string& prefix) const { scaler_.save_state(state, prefix); }
  void load_state(const kiln::state_dict& state, const std::string& prefix) { scaler_.load_state(state, prefix); }

  const loss_scaler& scaler() const { return scaler_; }

 private:
  loss_scaler scaler_;
};

}  // namespace kiln::precision
