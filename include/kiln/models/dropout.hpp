// kiln/models/dropout.hpp: inverted dropout, as torch::nn::Dropout, fused on the CPU.
//
//   auto drop = kiln::models::dropout(0.1);   // a module, like torch::nn::Dropout(0.1)
//   y = drop->forward(x);                     // x * keep / (1 - p) in training, x in eval
//   y = kiln::models::apply_dropout(x, 0.1, /*training=*/true);
//
// Same semantics as LibTorch's dropout: each element kept with probability 1 - p and scaled by
// 1 / (1 - p), the gradient masked and scaled the same way, the identity in eval mode or at
// p = 0. What differs is how: on the CPU for fp32, bf16 and fp16 tensors the mask comes from a
// counter-based generator in one vectorised, multi-threaded pass, and backward recomputes it
// from a 64-bit key rather than keeping it, where LibTorch keeps a mask as wide as the input
// (detail/dropout_kernel.hpp says why and how). The masks are
// drawn from LibTorch's CPU generator, so torch::manual_seed reproduces them and checkpointing
// recomputes them, but they are not the masks LibTorch's own dropout would draw for that seed.
// Other devices and dtypes (CUDA, whose dropout is already one fused kernel; fp64) use
// LibTorch's dropout.
#pragma once

#include <torch/torch.h>

#include <string>

#include "kiln/detail/kernels.hpp"
#include "kiln/errors.hpp"

namespace kiln::detail {

inline double checked_dropout_probability(double p) {
  if (!(p >= 0.0 && p <= 1.0))
    throw config_error("dropout probability must be in [0, 1], got " + std::to_string(p));
  return p;
}

}  // namespace kiln::detail

namespace kiln::models {

// x with each element zeroed with probability p and the rest scaled by 1 / (1 - p) when
// training; x itself otherwise.
KILN_KERNEL_ENTRY torch::Tensor apply_dropout(const torch::Tensor& x, double p, bool training);

class dropout_impl : public torch::nn::Cloneable<dropout_impl> {
 public:
  explicit dropout_impl(double p = 0.5) : p_(detail::checked_dropout_probability(p)) {}

  torch::Tensor forward(const torch::Tensor& x) { return apply_dropout(x, p_, is_training()); }

  void reset() override {}
  void pretty_print(std::ostream& stream) const override { stream << "kiln::models::dropout(p=" << p_ << ")"; }
  double p() const { return p_; }

 private:
  double p_;
};
TORCH_MODULE_IMPL(dropout, dropout_impl);

}  // namespace kiln::models

#if KILN_KERNEL_DEFINITIONS
#include <ATen/record_function.h>

#include <vector>

#include "kiln/models/detail/dropout_kernel.hpp"

KILN_KERNEL_ENTRY torch::Tensor kiln::models::apply_dropout(const torch::Tensor& x, double p, bool training) {
  detail::checked_dropout_probability(p);
  if (!training || p == 0.0) return x;
  if (p == 1.0 || !detail::fused_dropout_applies(x)) return torch::dropout(x, p, training);
  // One op to profilers and kiln's diagnostics, as LibTorch's dropout is: they then see its
  // result, not the half-finished buffers it is built from. (`guard` is the macro's.)
  RECORD_FUNCTION("kiln::dropout", std::vector<c10::IValue>{x});
  auto out = detail::dropout_function::apply(x, p);
  if (guard.isActive() && guard.needsOutputs()) guard.setOutputs(std::vector<c10::IValue>{out});
  return out;
}
#endif
