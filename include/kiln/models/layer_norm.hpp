// kiln/models/layer_norm.hpp: a torch::nn::LayerNorm applied with kiln's CPU kernel.
//
//   y = kiln::models::apply_layer_norm(*ln, x);   // as ln->forward(x), normalising the last dim
//
// Same value and gradients as LibTorch's layer_norm (tested in fp32, bf16 and fp16), computed by
// detail/layer_norm_kernel.hpp where it applies: on the CPU, for a LayerNorm over the last
// dimension with weight and bias, and input, weight and bias of one dtype among fp32, bf16 and
// fp16. That is where LibTorch 1.13 is slow: its bf16 CPU layer_norm is a scalar loop, 13 times
// fp32's time. Everything else (CUDA, fp64, no affine, several normalised dimensions) goes to
// torch::layer_norm, as ln.forward(x) does. Either way weights of another dtype than the input
// are cast to the input's (below). Like LibTorch's, the node keeps the input, the weight and two floats per row.
#pragma once

#include <torch/torch.h>

#include "kiln/detail/kernels.hpp"

namespace kiln::models {

KILN_KERNEL_ENTRY torch::Tensor apply_layer_norm(torch::nn::LayerNormImpl& ln, const torch::Tensor& x);

}  // namespace kiln::models

#if KILN_KERNEL_DEFINITIONS
#include <ATen/record_function.h>

#include <vector>

#include "kiln/models/detail/layer_norm_kernel.hpp"

KILN_KERNEL_ENTRY torch::Tensor kiln::models::apply_layer_norm(torch::nn::LayerNormImpl& ln, const torch::Tensor& x) {
  // Weight and bias of another dtype than the input (a bf16 activation under autocast, fp32
  // parameters) are cast to the input's, as LibTorch 2.x's layer_norm treats the mix; 1.13 throws.
  auto like_x = [&](const torch::Tensor& t) {
    return t.defined() && t.scalar_type() != x.scalar_type() && x.is_floating_point() ? t.to(x.scalar_type()) : t;
  };
  const auto weight = like_x(ln.weight), bias = like_x(ln.bias);
  const auto& shape = ln.options.normalized_shape();
  if (shape.size() != 1 || x.dim() < 1 || x.size(-1) != shape[0] || !detail::fused_layer_norm_applies(x, weight, bias))
    return torch::layer_norm(x, shape, weight, bias, ln.options.eps());
  RECORD_FUNCTION("kiln::layer_norm", std::vector<c10::IValue>{x});
  const auto d = shape[0];
  auto y = detail::layer_norm_function::apply(x.reshape({-1, d}).contiguous(), weight, bias, ln.options.eps());
  return y.view(x.sizes());
}
#endif
