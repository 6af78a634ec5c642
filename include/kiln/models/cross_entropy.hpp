// kiln/models/cross_entropy.hpp: mean cross-entropy over class logits that keeps nothing as
// large as the logits for backward. The loss kiln's trainer computes.
//
//   auto loss = kiln::models::cross_entropy(logits, targets);          // logits [N, C], targets [N]
//   auto loss = kiln::models::cross_entropy(logits, targets, -100);    // [B, T, C] and [B, T] too
//
// Same value and gradient as torch::nn::functional::cross_entropy with reduction mean and
// ignore_index (default -100): rows whose target is ignore_index are neither scored nor
// counted, a mean over no rows is NaN, a target outside [0, C) is an error. What differs:
//  - the arithmetic is fp32 (fp64 for fp64 logits) whatever the logits' dtype, so bf16 or fp16
//    logits give an fp32 loss, as autocast's cross_entropy does, with no fp32 copy of them;
//  - for backward it keeps the logits themselves (the tensor the model returned: no copy) and
//    two fp32 numbers per row (its max, the log of its sum of exponentials), and recomputes the
//    softmax from them, where LibTorch keeps
//    fp32 log-probabilities as large as the logits. For a language model the logits are the
//    largest activation, and the saving is taken at the end of forward, the step's peak;
//  - on the CPU, for fp32, bf16 and fp16 logits, forward and backward are each one vectorised,
//    multi-threaded pass over the logits (detail/cross_entropy_kernel.hpp). Elsewhere (CUDA,
//    fp64) the same scheme runs as LibTorch ops over blocks of rows.
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include "kiln/detail/kernels.hpp"

namespace kiln::models {

// Mean cross-entropy of class logits [N, C] (or [..., C]) against int64 class indices [N]
// (or [...]), skipping targets equal to ignore_index.
KILN_KERNEL_ENTRY torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                            std::int64_t ignore_index = -100);

}  // namespace kiln::models

#if KILN_KERNEL_DEFINITIONS
#include <ATen/record_function.h>

#include <string>
#include <vector>

#include "kiln/errors.hpp"
#include "kiln/models/detail/cross_entropy_kernel.hpp"

KILN_KERNEL_ENTRY torch::Tensor kiln::models::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                                            std::int64_t ignore_index) {
  if (logits.dim() < 2)
    throw config_error("cross_entropy: logits need a class dimension last ([N, C] or [..., C]), got " +
                       std::to_string(logits.dim()) + " dimension(s)");
  if (targets.scalar_type() != torch::kLong)
    throw config_error(std::string("cross_entropy: targets must be int64 class indices, got ") +
                       c10::toString(targets.scalar_type()));
  const auto classes = logits.size(-1);
  const auto rows = logits.numel() / std::max<std::int64_t>(classes, 1);
  if (targets.numel() != rows)
    throw config_error("cross_entropy: " + std::to_string(rows) + " rows of logits but " +
                       std::to_string(targets.numel()) + " targets");
  if (targets.device() != logits.device())
    throw config_error("cross_entropy: logits are on " + logits.device().str() + ", targets on " +
                       targets.device().str());
  RECORD_FUNCTION("kiln::cross_entropy", std::vector<c10::IValue>{logits});
  return detail::cross_entropy_function::apply(logits.reshape({rows, classes}).contiguous(),
                                               targets.reshape({rows}).contiguous(), ignore_index);
}
#endif
