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

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/errors.hpp"
#include "kiln/models/detail/cross_entropy_kernel.hpp"

namespace kiln::detail {

// Rows per block in the LibTorch-op path, so that its fp32 temporaries stay near 2^22 elements
// (16 MiB) however large the logits.
inline std::int64_t cross_entropy_block_rows(std::int64_t classes) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 22) / classes);
}

inline torch::ScalarType cross_entropy_math_type(const torch::Tensor& logits) {
  return logits.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// The LibTorch-op path of forward: the loss and each row's normaliser, block by block.
inline cross_entropy_forward_result cross_entropy_forward_ops(const torch::Tensor& logits, const torch::Tensor& targets,
                                                              std::int64_t ignore_index) {
  const std::int64_t rows = logits.size(0), c = logits.size(1);
  const auto math = cross_entropy_math_type(logits);
  const auto scored_rows = targets.ne(ignore_index);
  if (targets.device().is_cpu()) {  // on a GPU the gather below reports it, without a host sync here
    const auto bad = scored_rows.logical_and(targets.lt(0).logical_or(targets.ge(c))).nonzero();
    if (bad.size(0) > 0) {
      const auto row = bad[0][0].item<std::int64_t>();
      throw_target_out_of_range(row, targets[row].item<std::int64_t>(), c);
    }
  }
  auto norm = torch::empty({rows, 2}, logits.options().dtype(math));
  auto sum = torch::zeros({}, logits.options().dtype(math));
  for (std::int64_t first = 0; first < rows; first += cross_entropy_block_rows(c)) {
    const auto last = std::min(rows, first + cross_entropy_block_rows(c));
    const auto x = logits.slice(0, first, last).to(math);
    const auto scored = scored_rows.slice(0, first, last);
    const auto target = targets.slice(0, first, last).masked_fill(scored.logical_not(), 0);
    const auto max = std::get<0>(x.max(1, /*keepdim=*/true));  // NaN if the row holds one, as amax
    const auto log_sum = (x - max).exp_().sum(1, /*keepdim=*/true).log_();
    norm.slice(0, first, last).copy_(torch::cat({max, log_sum}, 1));
    const auto row_loss = (max - x.gather(1, target.unsqueeze(1))) + log_sum;
    sum += row_loss.squeeze(1).masked_fill(scored.logical_not(), 0).sum();
  }
  // Counted on the device, so that a GPU run need not wait for it. A mean over no rows is
  // 0 / 0: NaN, as LibTorch's.
  const auto scored = scored_rows.sum().to(math);
  return {sum / scored, norm, scored};
}

inline torch::Tensor cross_entropy_backward_ops(const torch::Tensor& logits, const torch::Tensor& targets,
                                                const torch::Tensor& norm, std::int64_t ignore_index,
                                                const torch::Tensor& scale) {
  const std::int64_t rows = logits.size(0), c = logits.size(1);
  const auto math = cross_entropy_math_type(logits);
  auto grad = torch::empty_like(logits, at::MemoryFormat::Contiguous);
  for (std::int64_t first = 0; first < rows; first += cross_entropy_block_rows(c)) {
    const auto last = std::min(rows, first + cross_entropy_block_rows(c));
    const auto scored = targets.slice(0, first, last).ne(ignore_index);
    const auto target = targets.slice(0, first, last).masked_fill(scored.logical_not(), 0);
    const auto block_norm = norm.slice(0, first, last);
    auto p = logits.slice(0, first, last).to(math).sub(block_norm.slice(1, 0, 1)).sub_(block_norm.slice(1, 1, 2)).exp_();
    p.scatter_add_(1, target.unsqueeze(1), torch::full({last - first, 1}, -1.0, p.options()));
    p.mul_((scored.to(math) * scale.to(math)).unsqueeze(1));
    grad.slice(0, first, last).copy_(p);
  }
  return grad;
}

// The autograd node: keeps the logits, the targets and each row's normaliser.
struct cross_entropy_function : torch::autograd::Function<cross_entropy_function> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, std::int64_t ignore_index) {
    auto result = fused_cross_entropy_applies(logits) ? cross_entropy_forward_cpu(logits, targets, ignore_index)
                                                      : cross_entropy_forward_ops(logits, targets, ignore_index);
    ctx->save_for_backward({logits, targets, result.norm, result.scored});
    ctx->saved_data["ignore_index"] = ignore_index;
    return result.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const auto ignore_index = ctx->saved_data["ignore_index"].toInt();
    const auto scale = grads[0] / saved[3];
    auto grad = fused_cross_entropy_applies(logits)
                    ? cross_entropy_backward_cpu(logits, saved[1], saved[2], ignore_index, scale.item<float>())
                    : cross_entropy_backward_ops(logits, saved[1], saved[2], ignore_index, scale);
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace kiln::detail

namespace kiln::models {

// Mean cross-entropy of class logits [N, C] (or [..., C]) against int64 class indices [N]
// (or [...]), skipping targets equal to ignore_index.
inline torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                   std::int64_t ignore_index = -100) {
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

}  // namespace kiln::models
