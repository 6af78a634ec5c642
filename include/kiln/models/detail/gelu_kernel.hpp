// kiln/models/detail/gelu_kernel.hpp: GELU's CPU kernels (the exact, erf form), one pass each way.
//
// Why: LibTorch 1.13's CPU gelu in bf16 costs 3.5 times its fp32 time (it converts element by
// element; `kiln profile` of the mixed-precision GPT on an AMD EPYC with AVX2: 20% of the bf16
// step). Here each element is widened to fp32 in a vector lane, and
//   gelu(x) = x Phi(x),   gelu'(x) = Phi(x) + x phi(x),   phi(x) = exp(-x^2/2) / sqrt(2 pi),
// with Phi from erfc(|x| / sqrt 2) = t P(t) exp(-x^2/2), t = 1 / (1 + p |x| / sqrt 2)
// (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7): Phi(x) = erfc/2 for x < 0, 1 - erfc/2 above,
// so the small values of Phi far left come from the complement directly, not from 1 - erf.
// exp is Cephes' (cross_entropy_kernel.hpp's exp_lanes). Results are within a few fp32 ulps of
// the exact function (tests/models/gelu_test.cpp); NaN stays NaN.
#pragma once

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "kiln/detail/simd.hpp"
#include "kiln/models/detail/cross_entropy_kernel.hpp"

namespace kiln::detail {

// Phi(x) and phi(x) of a vector of x.
template <class V>
[[gnu::always_inline]] inline void normal_cdf_pdf(const V& x, V& cdf, V& pdf) {
  const V z = (x < 0.0f ? -x : x) * 0.70710678118654752f;  // |x| / sqrt 2
  const V t = 1.0f / (1.0f + 0.3275911f * z);
  V poly = V{} + 1.061405429f;
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  const V e = exp_lanes(-(z * z));
  const V half_erfc = 0.5f * (poly * t) * e;
  cdf = x < 0.0f ? half_erfc : 1.0f - half_erfc;
  pdf = e * 0.39894228040143268f;  // 1 / sqrt(2 pi)
}

// y = gelu(x) over [first, last).
template <int Width, class T>
[[gnu::always_inline]] inline void gelu_forward_range(const T* x, T* y, std::int64_t first, std::int64_t last) {
  using V = float_vec<Width>;
  std::int64_t i = first;
  auto one = [&](V v) __attribute__((always_inline)) {
    V cdf, pdf;
    normal_cdf_pdf(v, cdf, pdf);
    return v * cdf;
  };
  for (; i + Width <= last; i += Width) store<V>(y + i, one(load<V>(x + i)));
  for (; i < last; ++i) {
    V v{};
    v[0] = static_cast<float>(x[i]);
    y[i] = static_cast<T>(one(v)[0]);
  }
}

// dx = dy * gelu'(x) over [first, last).
template <int Width, class T>
[[gnu::always_inline]] inline void gelu_backward_range(const T* x, const T* dy, T* dx, std::int64_t first,
                                                       std::int64_t last) {
  using V = float_vec<Width>;
  auto one = [&](V v, V g) __attribute__((always_inline)) {
    V cdf, pdf;
    normal_cdf_pdf(v, cdf, pdf);
    return g * (cdf + v * pdf);
  };
  std::int64_t i = first;
  for (; i + Width <= last; i += Width) store<V>(dx + i, one(load<V>(x + i), load<V>(dy + i)));
  for (; i < last; ++i) {
    V v{}, g{};
    v[0] = static_cast<float>(x[i]);
    g[0] = static_cast<float>(dy[i]);
    dx[i] = static_cast<T>(one(v, g)[0]);
  }
}

#ifdef KILN_GCC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
template <class T>
void gelu_forward_avx2(const T* x, T* y, std::int64_t first, std::int64_t last) {
  gelu_forward_range<8>(x, y, first, last);
}
template <class T>
void gelu_backward_avx2(const T* x, const T* dy, T* dx, std::int64_t first, std::int64_t last) {
  gelu_backward_range<8>(x, dy, dx, first, last);
}
#pragma GCC pop_options
#endif

// Whether the kernels take x: bf16 or fp16 on the CPU. fp32 goes to LibTorch's gelu, whose
// AVX2 + FMA erf is faster than this kernel's (0.65 against 1.3 ms for 1 M elements forward, 0.94
// against 1.9 backward, 2 threads, AMD EPYC); in bf16 LibTorch's took 3.9 and 5.6 ms, these 2.1
// and 2.2.
inline bool fused_gelu_applies(const torch::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kHalf);
}

// x contiguous; y of x's dtype.
inline torch::Tensor gelu_forward_cpu(const torch::Tensor& x) {
  auto y = torch::empty_like(x, at::MemoryFormat::Contiguous);
  with_lane_storage(x.scalar_type(), [&]<class scalar_t>(std::type_identity<scalar_t>) {
    const auto* xp = x.data_ptr<scalar_t>();
    auto* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), chunk_elements, [&](std::int64_t first, std::int64_t last) {
#ifdef KILN_GCC_X86
      if (cpu_has_avx2()) return gelu_forward_avx2(xp, yp, first, last);
#endif
      gelu_forward_range<4>(xp, yp, first, last);
    });
  });
  return y;
}

// x and dy contiguous, of one dtype; dx of that dtype.
inline torch::Tensor gelu_backward_cpu(const torch::Tensor& x, const torch::Tensor& dy) {
  auto dx = torch::empty_like(x, at::MemoryFormat::Contiguous);
  with_lane_storage(x.scalar_type(), [&]<class scalar_t>(std::type_identity<scalar_t>) {
    const auto* xp = x.data_ptr<scalar_t>();
    const auto* gp = dy.data_ptr<scalar_t>();
    auto* dp = dx.data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), chunk_elements, [&](std::int64_t first, std::int64_t last) {
#ifdef KILN_GCC_X86
      if (cpu_has_avx2()) return gelu_backward_avx2(xp, gp, dp, first, last);
#endif
      gelu_backward_range<4>(xp, gp, dp, first, last);
    });
  });
  return dx;
}

// The autograd node of kiln::models::gelu (gelu.hpp): keeps x, as LibTorch's does.
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
