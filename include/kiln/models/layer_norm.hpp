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

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <vector>

#include "kiln/models/detail/layer_norm_kernel.hpp"

namespace kiln::detail {

struct layer_norm_function : torch::autograd::Function<layer_norm_function> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
    auto [y, moments] = layer_norm_forward_cpu(x, weight, bias, eps);
    ctx->save_for_backward({x, weight, moments});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    auto dy = grads[0].to(x.scalar_type()).contiguous();
    auto g = layer_norm_backward_cpu(x, saved[1], saved[2], dy);
    return {g.input, g.weight, g.bias, torch::Tensor()};
  }
};

}  // namespace kiln::detail

namespace kiln::models {

inline torch::Tensor apply_layer_norm(torch::nn::LayerNormImpl& ln, const torch::Tensor& x) {
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

}  // namespace kiln::models
