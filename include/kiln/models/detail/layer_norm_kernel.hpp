// kiln/models/detail/layer_norm_kernel.hpp: LayerNorm over the last dimension on the CPU, one
// vectorised, multi-threaded pass per direction, in fp32 arithmetic whatever the storage.
//
// Why: LibTorch 1.13's CPU layer_norm has no vectorised path for bf16 or fp16 input; on a bf16
// residual stream (precision bf16-pure) it took 2.6 ms a call where fp32 takes 0.2 ms, 18% of
// the mixed-precision GPT's step. Converting to fp32 around it does not help: 1.13's own
// bf16 <-> fp32 copies are as slow. Here each row is widened in the vector lanes (simd.hpp),
// normalised in fp32, and rounded once on store, for fp32, bf16 and fp16 alike.
//
// Per row x of d elements, with weight w and bias b of d elements:
//   forward:  mean = sum(x) / d,  rstd = 1 / sqrt(sum((x - mean)^2) / d + eps)   (two passes)
//             y = (x - mean) * rstd * w + b;  (mean, rstd) kept per row for backward
//   backward: xhat = (x - mean) * rstd,  g = dy * w
//             dx = rstd * (g - sum(g) / d - xhat * sum(g * xhat) / d)
//             dw = sum over rows of dy * xhat,  db = sum over rows of dy
// dw and db are summed per block of rows whose size depends only on the shape, then over the
// blocks in order: the result does not depend on how many threads ran.
#pragma once

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kiln/detail/simd.hpp"

namespace kiln::detail {

// What backward needs of a row, stored as two consecutive floats.
struct row_moments {
  float mean;
  float rstd;
};
static_assert(sizeof(row_moments) == 2 * sizeof(float));

template <int Width, class T>
[[gnu::always_inline]] inline void layer_norm_forward_range(const T* x, const T* w, const T* b, T* y,
                                                            row_moments* moments, std::int64_t first,
                                                            std::int64_t last, std::int64_t d, float eps) {
  using V = float_vec<Width>;
  const std::int64_t body = d / Width * Width;
  for (std::int64_t r = first; r < last; ++r) {
    const T* row = x + r * d;
    T* out = y + r * d;
    V sv{};
    for (std::int64_t i = 0; i < body; i += Width) sv += load<V>(row + i);
    float sum = lanes_sum(sv);
    for (std::int64_t i = body; i < d; ++i) sum += static_cast<float>(row[i]);
    const float mean = sum / static_cast<float>(d);
    V qv{};
    for (std::int64_t i = 0; i < body; i += Width) {
      const V c = load<V>(row + i) - mean;
      qv += c * c;
    }
    float squares = lanes_sum(qv);
    for (std::int64_t i = body; i < d; ++i) {
      const float c = static_cast<float>(row[i]) - mean;
      squares += c * c;
    }
    const float rstd = 1.0f / std::sqrt(squares / static_cast<float>(d) + eps);
    moments[r] = {mean, rstd};
    for (std::int64_t i = 0; i < body; i += Width)
      store<V>(out + i, (load<V>(row + i) - mean) * rstd * load<V>(w + i) + load<V>(b + i));
    for (std::int64_t i = body; i < d; ++i)
      out[i] = static_cast<T>((static_cast<float>(row[i]) - mean) * rstd * static_cast<float>(w[i]) +
                              static_cast<float>(b[i]));
  }
}

// Rows [first, last): dx into dx, and dy * xhat and dy added into the block's fp32 partial sums
// dw_part and db_part (d floats each).
template <int Width, class T>
[[gnu::always_inline]] inline void layer_norm_backward_range(const T* x, const T* w, const T* dy,
                                                             const row_moments* moments, T* dx, float* dw_part,
                                                             float* db_part, std::int64_t first, std::int64_t last,
                                                             std::int64_t d) {
  using V = float_vec<Width>;
  const std::int64_t body = d / Width * Width;
  const float inv_d = 1.0f / static_cast<float>(d);
  for (std::int64_t r = first; r < last; ++r) {
    const T* row = x + r * d;
    const T* grad = dy + r * d;
    T* out = dx + r * d;
    const float mean = moments[r].mean, rstd = moments[r].rstd;
    V gv{}, gxv{};
    for (std::int64_t i = 0; i < body; i += Width) {
      const V g = load<V>(grad + i) * load<V>(w + i);
      gv += g;
      gxv += g * ((load<V>(row + i) - mean) * rstd);
    }
    float g_sum = lanes_sum(gv), gx_sum = lanes_sum(gxv);
    for (std::int64_t i = body; i < d; ++i) {
      const float g = static_cast<float>(grad[i]) * static_cast<float>(w[i]);
      g_sum += g;
      gx_sum += g * ((static_cast<float>(row[i]) - mean) * rstd);
    }
    const float g_mean = g_sum * inv_d, gx_mean = gx_sum * inv_d;
    for (std::int64_t i = 0; i < body; i += Width) {
      const V xhat = (load<V>(row + i) - mean) * rstd;
      const V upstream = load<V>(grad + i);
      store<V>(out + i, (upstream * load<V>(w + i) - g_mean - xhat * gx_mean) * rstd);
      store<V>(dw_part + i, load<V>(dw_part + i) + upstream * xhat);
      store<V>(db_part + i, load<V>(db_part + i) + upstream);
    }
    for (std::int64_t i = body; i < d; ++i) {
      const float xhat = (static_cast<float>(row[i]) - mean) * rstd;
      const float upstream = static_cast<float>(grad[i]);
      out[i] = static_cast<T>((upstream * static_cast<float>(w[i]) - g_mean - xhat * gx_mean) * rstd);
      dw_part[i] += upstream * xhat;
      db_part[i] += upstream;
    }
  }
}

#ifdef KILN_GCC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
template <class T>
void layer_norm_forward_avx2(const T* x, const T* w, const T* b, T* y, row_moments* moments, std::int64_t first,
                             std::int64_t last, std::int64_t d, float eps) {
  layer_norm_forward_range<8>(x, w, b, y, moments, first, last, d, eps);
}
template <class T>
void layer_norm_backward_avx2(const T* x, const T* w, const T* dy, const row_moments* moments, T* dx, float* dw_part,
                              float* db_part, std::int64_t first, std::int64_t last, std::int64_t d) {
  layer_norm_backward_range<8>(x, w, dy, moments, dx, dw_part, db_part, first, last, d);
}
#pragma GCC pop_options
#endif

// Whether the kernels take this input: on the CPU, contiguous rows, and input, weight and bias
// of one dtype that the vector lanes take (fp32, bf16, fp16).
inline bool fused_layer_norm_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return x.device().is_cpu() && is_lane_dtype(x.scalar_type()) && weight.defined() && bias.defined() &&
         weight.scalar_type() == x.scalar_type() && bias.scalar_type() == x.scalar_type() && weight.is_cpu() &&
         bias.is_cpu() && weight.is_contiguous() && bias.is_contiguous();
}

// x [rows, d] contiguous; returns y (x's dtype) and moments [rows, 2] fp32.
inline std::pair<torch::Tensor, torch::Tensor> layer_norm_forward_cpu(const torch::Tensor& x, const torch::Tensor& weight,
                                                                      const torch::Tensor& bias, double eps) {
  const std::int64_t rows = x.size(0), d = x.size(1);
  auto y = torch::empty_like(x, at::MemoryFormat::Contiguous);
  auto moments = torch::empty({rows, 2}, x.options().dtype(torch::kFloat32));
  with_lane_storage(x.scalar_type(), [&]<class scalar_t>(std::type_identity<scalar_t>) {
    const auto* xp = x.data_ptr<scalar_t>();
    const auto* wp = weight.data_ptr<scalar_t>();
    const auto* bp = bias.data_ptr<scalar_t>();
    auto* yp = y.data_ptr<scalar_t>();
    auto* mp = reinterpret_cast<row_moments*>(moments.data_ptr<float>());
    const auto e = static_cast<float>(eps);
    at::parallel_for(0, rows, chunk_rows(d), [&](std::int64_t first, std::int64_t last) {
#ifdef KILN_GCC_X86
      if (cpu_has_avx2()) return layer_norm_forward_avx2(xp, wp, bp, yp, mp, first, last, d, e);
#endif
      layer_norm_forward_range<4>(xp, wp, bp, yp, mp, first, last, d, e);
    });
  });
  return {y, moments};
}

struct layer_norm_grads {
  torch::Tensor input, weight, bias;
};

inline layer_norm_grads layer_norm_backward_cpu(const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& moments, const torch::Tensor& dy) {
  const std::int64_t rows = x.size(0), d = x.size(1);
  // Blocks of rows sized by the shape alone (at least a thread chunk, at most 256 blocks), each
  // with its own partial sums of dw and db.
  const std::int64_t block = std::max(chunk_rows(d), (rows + 255) / 256);
  const std::int64_t blocks = std::max<std::int64_t>(1, (rows + block - 1) / block);
  auto partial = torch::zeros({blocks, 2, d}, x.options().dtype(torch::kFloat32));
  auto dx = torch::empty_like(x, at::MemoryFormat::Contiguous);
  with_lane_storage(x.scalar_type(), [&]<class scalar_t>(std::type_identity<scalar_t>) {
    const auto* xp = x.data_ptr<scalar_t>();
    const auto* wp = weight.data_ptr<scalar_t>();
    const auto* gp = dy.data_ptr<scalar_t>();
    const auto* mp = reinterpret_cast<const row_moments*>(moments.data_ptr<float>());
    auto* dxp = dx.data_ptr<scalar_t>();
    auto* pp = partial.data_ptr<float>();
    at::parallel_for(0, blocks, 1, [&](std::int64_t first_block, std::int64_t last_block) {
      for (std::int64_t k = first_block; k < last_block; ++k) {
        const std::int64_t first = k * block, last = std::min(rows, first + block);
        float* dw_part = pp + k * 2 * d;
        float* db_part = dw_part + d;
#ifdef KILN_GCC_X86
        if (cpu_has_avx2()) {
          layer_norm_backward_avx2(xp, wp, gp, mp, dxp, dw_part, db_part, first, last, d);
          continue;
        }
#endif
        layer_norm_backward_range<4>(xp, wp, gp, mp, dxp, dw_part, db_part, first, last, d);
      }
    });
  });
  // Over the blocks in order (a LibTorch sum(0) promises no order).
  auto totals = torch::zeros({2, d}, partial.options());
  float* t = totals.data_ptr<float>();
  const float* p = partial.data_ptr<float>();
  for (std::int64_t k = 0; k < blocks; ++k)
    for (std::int64_t i = 0; i < 2 * d; ++i) t[i] += p[k * 2 * d + i];
  return {dx, totals[0].to(weight.scalar_type()), totals[1].to(weight.scalar_type())};
}

// The autograd node of kiln::models::apply_layer_norm (layer_norm.hpp): keeps the input, the
// weight and two floats per row.
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
