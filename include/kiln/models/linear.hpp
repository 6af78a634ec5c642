// kiln/models/linear.hpp: a torch::nn::Linear applied the way autocast expects.
//
//   y = kiln::models::apply_linear(*layer, x);   // x [..., in] -> [..., out], as layer->forward(x)
//
// Why not layer->forward(x): LibTorch's C++ Linear (torch::nn::functional::linear, a header)
// does not call aten::linear. For a 2-D input it calls addmm; for the 3-D inputs of every
// sequence model it calls matmul and then `output += bias`. Autocast has rules for linear,
// addmm and matmul but none for an in-place add, so under bf16 autocast the matmul runs in bf16
// and the fp32 bias is then added by copying the whole bf16 output to an fp32 temporary and
// back. On kiln's gpt that temporary of the MLP's 4 x d_model-wide output was the training
// step's memory peak (5 MiB over everything forward keeps for backward), and the copies cost
// time in every layer. Python's nn.Linear goes through aten::linear and does not have this.
// Here the input is flattened to [rows, in] and goes through aten::linear, whose autocast rule
// casts input, weight and bias alike and whose 2-D case is one addmm (bias added in the matmul).
// Outside autocast the result is the same as layer->forward(x).
#pragma once

#include <torch/torch.h>

namespace kiln::models {

inline torch::Tensor apply_linear(const torch::nn::LinearImpl& layer, const torch::Tensor& x) {
  if (x.dim() <= 2) return torch::linear(x, layer.weight, layer.bias);
  auto sizes = x.sizes().vec();
  sizes.back() = layer.weight.size(0);
  return torch::linear(x.reshape({-1, x.size(-1)}), layer.weight, layer.bias).view(sizes);
}

}  // namespace kiln::models
