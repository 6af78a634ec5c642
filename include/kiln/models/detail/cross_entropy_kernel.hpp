// kiln/models/detail/cross_entropy_kernel.hpp: cross-entropy's CPU kernels, one pass over the
// logits each way, with the softmax recomputed in backward from one number per row.
//
// Why: LibTorch's cross_entropy is log_softmax then nll_loss. log_softmax writes, and keeps for
// backward, a tensor of log-probabilities as large as the logits, in fp32 under autocast even
// when the logits are bf16 (autocast runs the loss in fp32, so it first makes an fp32 copy of
// the logits as well). At the end of a language model's forward, which is where its training
// step peaks, those two are the largest things alive: for a vocabulary of V they cost 8 bytes
// per token and vocabulary entry over the 2 the bf16 logits themselves take. Here forward keeps
// the logits (the node holds the model's own output tensor, no copy) and two numbers per row (its
// max and the log of its sum of exponentials), and backward recomputes softmax(row) on the fly
// from them: the same arithmetic in fp32, as precise as LibTorch's at any logit magnitude,
// nothing as large as the logits created in forward, and two reads of the logits in forward
// and one read and one write in backward where LibTorch makes five passes.
//
// Per row r with target t (rows whose target is ignore_index count for nothing):
//   forward:  m_r = max_c x_rc,  s_r = log(sum_c exp(x_rc - m_r));  loss_r = (m_r - x_rt) + s_r
//             loss = sum_r loss_r / (rows scored), summed in a fixed order, in double
//   backward: dx_rc = (exp((x_rc - m_r) - s_r) - [c == t]) * grad / (rows scored)
// m_r and s_r are kept apart rather than as their sum, the log-sum-exp: at logits near 1e4 an
// fp32 log-sum-exp is off by up to half an ulp of 1e4 (5e-4), and so, relatively, is every
// probability recomputed from it. x - m is exact and s small, as in LibTorch's log_softmax.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/detail/simd.hpp"

namespace kiln::detail {

// e^x lane by lane for x <= 88.7 (softmax only asks for x - max <= 0): Cephes' expf, a degree-7
// polynomial on [-ln2/2, ln2/2] after taking out a power of two, about 1 ulp from the true
// value. NaN stays NaN; below -87.3 the result is e^-87.3 ~ 1e-38, not 0, which changes no sum.
template <class V>
[[gnu::always_inline]] inline V exp_lanes(V x) {
  constexpr int width = width_of<V>;
  using I = i32_vec<width>;
  x = x < -87.3365478515625f ? V{} - 87.3365478515625f : x;  // keeps NaN: the comparison is false
  const V scaled = x * 1.44269504088896341f;
  const I k = __builtin_convertvector(scaled + (scaled < 0.0f ? V{} - 0.5f : V{} + 0.5f), I);
  const V kf = __builtin_convertvector(k, V);
  const V r = x - kf * 0.693359375f + kf * 2.12194440e-4f;  // ln 2 in two parts, exactly
  const V r2 = r * r;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  const I bits = (k + 127) << 23;  // 2^k, k >= -126 after the clamp
  V two_k;
  std::memcpy(&two_k, &bits, sizeof(V));
  return p * two_k;
}

template <class V>
[[gnu::always_inline]] inline float lanes_max(const V& v) {
  float m = v[0];
  for (int i = 1; i < width_of<V>; ++i) m = v[i] > m || v[i] != v[i] ? v[i] : m;
  return m;
}

// A scalar element through the same exp as the lanes, so a row's tail adds up like its body.
template <int Width>
[[gnu::always_inline]] inline float exp_one(float x) {
  float_vec<Width> v{};
  v[0] = x;
  return exp_lanes(v)[0];
}

// What backward needs of a row to recompute its softmax, stored as two consecutive floats.
struct row_normaliser {
  float max;      // m = max_c x_c (NaN if the row holds one)
  float log_sum;  // log(sum_c exp(x_c - m))
};
static_assert(sizeof(row_normaliser) == 2 * sizeof(float));

template <int Width, class T>
[[gnu::always_inline]] inline row_normaliser row_normaliser_of(const T* x, std::int64_t c) {
  using V = float_vec<Width>;
  const std::int64_t body = c / Width * Width;
  float m = -std::numeric_limits<float>::infinity();
  if (body > 0) {
    V mv = load<V>(x);
    for (std::int64_t i = Width; i < body; i += Width) {
      const V v = load<V>(x + i);
      mv = (v > mv) | (v != v) ? v : mv;  // NaN wins, as in torch.max
    }
    m = lanes_max(mv);
  }
  for (std::int64_t i = body; i < c; ++i) {
    const float v = static_cast<float>(x[i]);
    if (v > m || v != v) m = v;
  }
  // A row of -inf (everything masked) has no finite max: its sum is then e^nan, nan, as LibTorch's.
  V sv{};
  for (std::int64_t i = 0; i < body; i += Width) sv += exp_lanes(load<V>(x + i) - m);
  float s = lanes_sum(sv);
  for (std::int64_t i = body; i < c; ++i) s += exp_one<Width>(static_cast<float>(x[i]) - m);
  return {m, std::log(s)};
}

// Row by row over rows [first, last): each row's normaliser into norm, its loss into loss (0 for
// ignored rows); a target outside [0, c) other than ignore_index is reported through bad_row.
template <int Width, class T>
[[gnu::always_inline]] inline void cross_entropy_forward_range(const T* logits, const std::int64_t* targets,
                                                               std::int64_t first, std::int64_t last, std::int64_t c,
                                                               std::int64_t ignore_index, row_normaliser* norm,
                                                               double* loss, std::int64_t& bad_row) {
  for (std::int64_t r = first; r < last; ++r) {
    const T* row = logits + r * c;
    norm[r] = row_normaliser_of<Width>(row, c);
    const std::int64_t t = targets[r];
    if (t == ignore_index) {
      loss[r] = 0.0;
    } else if (t < 0 || t >= c) {
      loss[r] = 0.0;
      if (bad_row < 0) bad_row = r;
    } else {
      loss[r] = (static_cast<double>(norm[r].max) - static_cast<double>(static_cast<float>(row[t]))) +
                static_cast<double>(norm[r].log_sum);
    }
  }
}

// dx = (exp((x - m) - s) - onehot(target)) * scale for rows [first, last); ignored rows get 0.
template <int Width, class T>
[[gnu::always_inline]] inline void cross_entropy_backward_range(const T* logits, const std::int64_t* targets,
                                                                const row_normaliser* norm, std::int64_t first,
                                                                std::int64_t last, std::int64_t c,
                                                                std::int64_t ignore_index, float scale, T* grad) {
  using V = float_vec<Width>;
  const std::int64_t body = c / Width * Width;
  for (std::int64_t r = first; r < last; ++r) {
    const T* row = logits + r * c;
    T* out = grad + r * c;
    const std::int64_t t = targets[r];
    const float s = t == ignore_index ? 0.0f : scale;
    const float m = norm[r].max, log_sum = norm[r].log_sum;
    auto p = [&](float x) __attribute__((always_inline)) { return exp_one<Width>((x - m) - log_sum); };
    for (std::int64_t i = 0; i < body; i += Width) store<V>(out + i, exp_lanes((load<V>(row + i) - m) - log_sum) * s);
    for (std::int64_t i = body; i < c; ++i) out[i] = static_cast<T>(p(static_cast<float>(row[i])) * s);
    if (t != ignore_index) out[t] = static_cast<T>((p(static_cast<float>(row[t])) - 1.0f) * s);
  }
}

#ifdef KILN_GCC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
template <class T>
void cross_entropy_forward_avx2(const T* logits, const std::int64_t* targets, std::int64_t first, std::int64_t last,
                                std::int64_t c, std::int64_t ignore_index, row_normaliser* norm, double* loss,
                                std::int64_t& bad_row) {
  cross_entropy_forward_range<8>(logits, targets, first, last, c, ignore_index, norm, loss, bad_row);
}
template <class T>
void cross_entropy_backward_avx2(const T* logits, const std::int64_t* targets, const row_normaliser* norm,
                                 std::int64_t first, std::int64_t last, std::int64_t c, std::int64_t ignore_index,
                                 float scale, T* grad) {
  cross_entropy_backward_range<8>(logits, targets, norm, first, last, c, ignore_index, scale, grad);
}
#pragma GCC pop_options
#endif

// Whether the fused kernels take these logits ([rows, classes], contiguous, fp32, bf16 or fp16 on
// the CPU); others go through the same recomputing scheme in LibTorch ops (cross_entropy.hpp).
inline bool fused_cross_entropy_applies(const torch::Tensor& logits) {
  return logits.device().is_cpu() && is_lane_dtype(logits.scalar_type());
}

// In the arithmetic's dtype (fp32, or fp64 for fp64 logits), on the logits' device.
struct cross_entropy_forward_result {
  torch::Tensor loss;    // scalar
  torch::Tensor norm;    // [rows, 2]: each row's max m and log(sum exp(x - m)), as row_normaliser
  torch::Tensor scored;  // scalar: the rows not ignored, by which backward divides
};

[[noreturn]] inline void throw_target_out_of_range(std::int64_t row, std::int64_t target, std::int64_t classes) {
  throw std::out_of_range("cross_entropy: target " + std::to_string(target) + " at row " + std::to_string(row) +
                          " is outside [0, " + std::to_string(classes) + ") and is not the ignore_index");
}

// logits [rows, c] contiguous fp32/bf16/fp16 on the CPU, targets int64 [rows] contiguous.
inline cross_entropy_forward_result cross_entropy_forward_cpu(const torch::Tensor& logits, const torch::Tensor& targets,
                                                              std::int64_t ignore_index) {
  const std::int64_t rows = logits.size(0), c = logits.size(1);
  auto norm = torch::empty({rows, 2}, logits.options().dtype(torch::kFloat32));
  std::vector<double> loss(static_cast<std::size_t>(rows));
  std::int64_t first_bad = rows;
  std::mutex bad_mutex;
  with_lane_storage(logits.scalar_type(), [&]<class scalar_t>(std::type_identity<scalar_t>) {
    const auto* x = logits.data_ptr<scalar_t>();
    const auto* t = targets.data_ptr<std::int64_t>();
    auto* n = reinterpret_cast<row_normaliser*>(norm.data_ptr<float>());
    at::parallel_for(0, rows, chunk_rows(c), [&](std::int64_t first, std::int64_t last) {
      std::int64_t bad = -1;
#ifdef KILN_GCC_X86
      if (cpu_has_avx2()) cross_entropy_forward_avx2(x, t, first, last, c, ignore_index, n, loss.data(), bad);
      else
#endif
        cross_entropy_forward_range<4>(x, t, first, last, c, ignore_index, n, loss.data(), bad);
      if (bad >= 0) {
        std::lock_guard lock(bad_mutex);
        first_bad = std::min(first_bad, bad);
      }
    });
  });
  const auto* t = targets.data_ptr<std::int64_t>();
  if (first_bad < rows) throw_target_out_of_range(first_bad, t[first_bad], c);
  // In row order, whatever the threads: the loss does not depend on how the rows were split.
  double sum = 0.0;
  std::int64_t scored = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    sum += loss[static_cast<std::size_t>(r)];
    scored += t[r] != ignore_index;
  }
  // No scored row: 0 / 0, NaN, as LibTorch's mean over nothing.
  const double mean = scored > 0 ? sum / static_cast<double>(scored) : std::numeric_limits<double>::quiet_NaN();
  const auto scalar = logits.options().dtype(torch::kFloat32);
  return {torch::full({}, mean, scalar), norm, torch::full({}, static_cast<double>(scored), scalar)};
}

inline torch::Tensor cross_entropy_backward_cpu(const torch::Tensor& logits, const torch::Tensor& targets,
                                                const torch::Tensor& norm, std::int64_t ignore_index, float scale) {
  const std::int64_t rows = logits.size(0), c = logits.size(1);
  auto grad = torch::empty_like(logits, at::MemoryFormat::Contiguous);
  with_lane_storage(logits.scalar_type(), [&]<class scalar_t>(std::type_identity<scalar_t>) {
    const auto* x = logits.data_ptr<scalar_t>();
    const auto* t = targets.data_ptr<std::int64_t>();
    const auto* n = reinterpret_cast<const row_normaliser*>(norm.data_ptr<float>());
    auto* g = grad.data_ptr<scalar_t>();
    at::parallel_for(0, rows, chunk_rows(c), [&](std::int64_t first, std::int64_t last) {
#ifdef KILN_GCC_X86
      if (cpu_has_avx2()) return cross_entropy_backward_avx2(x, t, n, first, last, c, ignore_index, scale, g);
#endif
      cross_entropy_backward_range<4>(x, t, n, first, last, c, ignore_index, scale, g);
    });
  });
  return grad;
}

}  // namespace kiln::detail

// The LibTorch-op path (CUDA, fp64) and the autograd node of kiln::models::cross_entropy.
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
