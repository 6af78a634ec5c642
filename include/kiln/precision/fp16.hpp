// kiln/precision/fp16.hpp: float16 autocast with dynamic loss scaling (PyTorch's AMP recipe).
//
// fp16 has a 5-bit exponent: gradients underflow without loss scaling, so this policy pairs
// autocast(fp16) with kiln::loss_scaler (GradScaler's semantics: 2^16, x2 after 2000 finite
// steps, x0.5 and a skipped step on overflow; its state is saved and resumed). It runs on CUDA,
// and on the CPU where LibTorch's CPU autocast does float16 (PyTorch 2.x). LibTorch 1.13's CPU
// autocast accepts only bfloat16 and it has no CPU float16 matmul, so there this policy refuses
// a CPU device, with LibTorch's reason, instead of silently training in fp32.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/detail/compat.hpp"
#include "kiln/errors.hpp"
#include "kiln/precision/bf16.hpp"
#include "kiln/precision/loss_scaler.hpp"

namespace kiln::precision {

struct fp16 {
  using axis = kiln::axis::precision;
  static constexpr std::string_view kind = "fp16";

  struct settings : loss_scaler_settings {};

  // Until the accelerator says which device it trains on, the one "auto" would pick.
  explicit fp16(const settings& s) : scaler_(s) {
    use_device(torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU));
  }

  // The accelerator calls this with its device: float16 autocast runs there and only there
  // (on a GPU, CPU ops stay fp32 rather than meeting float16 kernels the CPU may lack).
  void use_device(const torch::Device& device) {
    if (device.is_cpu())
      if (const auto& why = kiln::detail::cpu_half_autocast_failure(); !why.empty())
        throw config_error("precision.kind = \"fp16\" cannot train on the CPU with this LibTorch (" TORCH_VERSION
                           "): its CPU autocast has no float16 (LibTorch says: " + why +
                           "); set [train] device = \"cuda\" on a GPU, or use kind = \"bf16\" (the same memory "
                           "saving, no loss scaling needed)");
    on_cpu_ = device.is_cpu();
  }

  detail::device_autocast autocast() const { return detail::device_autocast(at::kHalf, /*cpu=*/on_cpu_); }
  torch::Tensor scale(const torch::Tensor& loss) const { return scaler_.scale(loss); }
  bool unscale_and_check(std::vector<torch::Tensor>& params) { return scaler_.unscale_and_check(params); }
  void update(bool all_finite) { scaler_.update(all_finite); }

  void save_state(kiln::state_dict& state, const std::string& prefix) const { scaler_.save_state(state, prefix); }
  void load_state(const kiln::state_dict& state, const std::string& prefix) { scaler_.load_state(state, prefix); }

  const loss_scaler& scaler() const { return scaler_; }

 private:
  loss_scaler scaler_;
  bool on_cpu_ = false;
};

}  // namespace kiln::precision
