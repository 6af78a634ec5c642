// kiln/models/gelu.hpp: GELU (the exact, erf form) with kiln's CPU kernel.
//
//   y = kiln::models::gelu(x);   // as torch::gelu(x)
//
// On the CPU for bf16 and fp16 it runs detail/gelu_kernel.hpp's vector loops (fp32 arithmetic;
// LibTorch 1.13's bf16 gelu converts element by element, at 1.8-2.6 times their time); fp32 and
// everything else go to torch::gelu, whose fp32 kernel is the faster one. The node keeps x, as
// LibTorch's does.
#pragma once

#include <torch/torch.h>

#include "kiln/detail/kernels.hpp"

namespace kiln::models {

KILN_KERNEL_ENTRY torch::Tensor gelu(const torch::Tensor& x);

}  // namespace kiln::models

#if KILN_KERNEL_DEFINITIONS
#include <ATen/record_function.h>

#include <vector>

#include "kiln/models/detail/gelu_kernel.hpp"

KILN_KERNEL_ENTRY torch::Tensor kiln::models::gelu(const torch::Tensor& x) {
  if (!detail::fused_gelu_applies(x)) return torch::gelu(x);
  RECORD_FUNCTION("kiln::gelu", std::vector<c10::IValue>{x});
  return detail::gelu_function::apply(x.contiguous());
}
#endif
