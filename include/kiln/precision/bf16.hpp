// kiln/precision/bf16.hpp: bfloat16 autocast (mixed precision) with fp32 parameters.
//
// Inside autocast, matmuls and convolutions run in bf16 (half the bytes of their activations
// and, on CPUs with AVX-512 BF16 or on GPUs, faster kernels), while losses, softmax and
// reductions that need range stay fp32 (LibTorch's autocast lists). Parameters, gradients and
// optimizer state stay fp32. bf16 has fp32's exponent range, so no loss scaling is needed.
// CPU autocast is always on; CUDA autocast too when LibTorch sees a GPU.
// On a CPU where LibTorch's bf16 GEMM is a slow loop that accumulates in bf16 (no AVX-512), the
// matmuls take bf16 operands and compute in fp32 (`cpu_matmul`, detail/cpu_bf16.hpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/detail/compat.hpp"
#include "kiln/precision/detail/cpu_bf16.hpp"

namespace kiln::precision {

namespace detail {
// Autocast on the CPU and, where present, on CUDA, for one dtype.
class device_autocast {
 public:
  explicit device_autocast(at::ScalarType dtype, bool cpu = true) {
    if (cpu) cpu_.emplace(c10::DeviceType::CPU, dtype);
    if (torch::cuda::is_available()) cuda_.emplace(c10::DeviceType::CUDA, dtype);
  }

 private:
  std::optional<kiln::detail::autocast_scope> cpu_, cuda_;
};
}  // namespace detail

struct bf16 {
  using axis = kiln::axis::precision;
  static constexpr std::string_view kind = "bf16";
  static constexpr bool always_finite = true;  // bf16 has fp32's range: no scale, no skipped step

  struct settings {
    matmul_mode cpu_matmul = matmul_mode::automatic;
    template <class V>
    void describe(V& v) {
      v.field("cpu_matmul", cpu_matmul, detail::cpu_matmul_help);
    }
  };

  bf16() : bf16(settings{}) {}
  explicit bf16(const settings& s) : cpu_kernels_(s.cpu_matmul) {}

  detail::device_autocast autocast() const { return detail::device_autocast(at::kBFloat16); }
  torch::Tensor scale(const torch::Tensor& loss) const { return loss; }
  bool unscale_and_check(std::vector<torch::Tensor>&) { return true; }
  void update(bool) {}

 private:
  detail::cpu_bf16_kernels cpu_kernels_;
};

}  // namespace kiln::precision
