// kiln/models/gelu.hpp: GELU (the exact, erf form) with kiln's CPU kernel.
//
//   y = kiln::models::gelu(x);   // as torch::gelu(x)
//
// On the CPU for bf16 and fp16 it runs detail/gelu_kernel.hpp's vector loops (fp32 arithmetic;
// LibTorch 1.13's bf16 gelu converts element by element, at 1.8-2.6 times their time); fp32 and
// everything else go to torch::gelu, whose fp32 kernel is the faster one. The node keeps x, as
// LibTorch's does.
#pragma once

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <vector>

#include "kiln/models/detail/gelu_kernel.hpp"

namespace kiln::detail {

struct gelu_function : torch::autograd::Function<gelu_function> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->save_for_backward({x});
    return gelu_forward_cpu(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto x = ctx->get_saved_variables()[0];
    return {gelu_backward_cpu(x, grads[0].to(x.scalar_type()).contiguous())};
  }
};

}  // namespace kiln::detail

namespace kiln::models {

inline torch::Tensor gelu(const torch::Tensor& x) {
  if (!detail::fused_gelu_applies(x)) return torch::gelu(x);
  RECORD_FUNCTION("kiln::gelu", std::vector<c10::IValue>{x});
  return detail::gelu_function::apply(x.contiguous());
}

}  // namespace kiln::models
