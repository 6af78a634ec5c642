// kiln/optim/detail/fused_loop.hpp: one pass over a parameter, its gradient and its state
// buffers, vectorised and split over threads with at::parallel_for: the shape of every fused
// update rule in kiln::optim.
//
// An update rule is written once as a generic callable over `V` (a float vector or a float):
//
//   fused_loop(n, [=](auto& p, const auto& g, auto& m) { m = m * b + g * (1 - b); p = p - m * lr; },
//              param_ptr, /*compensation=*/nullptr, grad_ptr, state_ptr);
//
// Scalars broadcast (`m * b`); vsqrt, vmax and vsign below work on both forms. The rule sees the
// parameter and gradient as fp32 whatever their storage (fp32, or bf16 widened on load and
// rounded to nearest-even on store, as c10::BFloat16 does), and each state buffer as fp32. The
// vector body runs on whole vectors and the same rule on plain floats for the tail. A bf16
// parameter may come with a Kahan compensation buffer (the pointer after the parameter's; null
// for none): see store_compensated.
//
// The vector types, loads and stores, and the choice between a baseline and an AVX2 copy of each
// loop are kiln/detail/simd.hpp's (see there for why not at::vec::Vectorized). Not FMA: a fused
// multiply-add rounds once where LibTorch's kernels round twice, and the loops are memory-bound
// anyway; without it both copies give bit-identical results (tested), so a run does not depend
// on which CPU it lands on.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/torch.h>

#include "kiln/detail/compat.hpp"
#include "kiln/detail/simd.hpp"

namespace kiln::optim::detail {

using kiln::detail::float_vec;
using kiln::detail::load;
using kiln::detail::store;
using kiln::detail::u16_vec;
using kiln::detail::u32_vec;
#ifdef KILN_GCC_X86
using kiln::detail::cpu_has_avx2;
#endif

template <class V>
inline constexpr bool is_float_vec = !std::is_same_v<V, float>;

// The few non-arithmetic operations update rules need, for vectors and scalars alike.
template <class V>
[[gnu::always_inline]] inline V vsqrt(const V& x) {
  if constexpr (!is_float_vec<V>) {
    return std::sqrt(x);
  } else {
#ifdef KILN_GCC_X86
    // sqrtps (SSE, in every x86-64) on 4-float halves; unlike std::sqrt it keeps no errno, which
    // is what stops a per-lane std::sqrt from vectorising. Halves are split and joined by
    // shuffles, not through memory: a 32-byte load of two 16-byte stores stalls.
    if constexpr (sizeof(V) == 16) {
      return __builtin_ia32_sqrtps(x);
    } else {
      const auto lo = __builtin_ia32_sqrtps(__builtin_shufflevector(x, x, 0, 1, 2, 3));
      const auto hi = __builtin_ia32_sqrtps(__builtin_shufflevector(x, x, 4, 5, 6, 7));
      return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
    }
#else
    V out;
    for (std::size_t k = 0; k < sizeof(V) / sizeof(float); ++k) out[k] = std::sqrt(x[k]);
    return out;
#endif
  }
}
template <class V>
[[gnu::always_inline]] inline V vmax(const V& a, const V& b) {
  if constexpr (!is_float_vec<V>) return std::max(a, b);
  else return a < b ? b : a;  // std::max's choice, lane by lane
}
template <class V>
[[gnu::always_inline]] inline V vsign(const V& x) {
  if constexpr (!is_float_vec<V>) return static_cast<float>((x > 0.f) - (x < 0.f));
  else return __builtin_convertvector((x < 0.f) - (x > 0.f), V);  // comparisons give -1 for true
}

// Kahan-compensated bf16 updates (precision::bf16_pure with kahan = true): a rule moved a bf16
// weight from `before` to `after` in fp32; the weight takes the bf16 rounding of before plus
// that move plus what earlier roundings left out (`compensation`), and `compensation` keeps what
// this rounding leaves out. An update far below half a bf16 ulp of its weight thus builds up in
// the compensation until it moves the weight, instead of rounding away at every step. The
// difference `sum - rounded` is exact in fp32; storing it in bf16 keeps its leading 8 bits,
// which is what a 2-byte buffer can hold (optimi's Kahan summation stores it the same way).
template <class V>
[[gnu::always_inline]] inline void store_compensated(c10::BFloat16* param, c10::BFloat16* compensation, const V& before,
                                                     const V& after) {
  const V sum = before + ((after - before) + load<V>(compensation));
  store<V>(param, sum);
  store<V>(compensation, sum - load<V>(param));
}
[[gnu::always_inline]] inline void store_compensated(c10::BFloat16* param, c10::BFloat16* compensation, float before,
                                                     float after) {
  const float sum = before + ((after - before) + static_cast<float>(*compensation));
  *param = static_cast<c10::BFloat16>(sum);
  *compensation = static_cast<c10::BFloat16>(sum - static_cast<float>(*param));
}

// rule(p, g, state...) over elements [begin, end), `Width` floats at a time; with `Compensated`
// (bf16 parameters only), each new value is stored by store_compensated.
template <int Width, bool Compensated, class T, class Rule, class... State>
[[gnu::always_inline]] inline void fused_range(std::int64_t begin, std::int64_t end, const Rule& rule, T* param,
                                               c10::BFloat16* compensation, const T* grad, State*... state) {
  using V = float_vec<Width>;
  // A local copy the compiler can keep in registers: the rule's hyper-parameters could
  // otherwise alias the floats this loop stores, and be reloaded for every vector.
  const Rule r = rule;
  std::int64_t i = begin;
  const std::int64_t vector_end = begin + (end - begin) / Width * Width;
  for (; i < vector_end; i += Width) {
    V p = load<V>(param + i);
    [[maybe_unused]] const V before = p;
    const V g = load<V>(grad + i);
    [&](auto... s) __attribute__((always_inline)) {
      r(p, g, s...);
      (store<V>(state + i, s), ...);
    }(load<V>(state + i)...);
    if constexpr (Compensated) store_compensated(param + i, compensation + i, before, p);
    else store<V>(param + i, p);
  }
  for (; i < end; ++i) {
    float p = static_cast<float>(param[i]);
    [[maybe_unused]] const float before = p;
    r(p, static_cast<float>(grad[i]), state[i]...);
    if constexpr (Compensated) store_compensated(param + i, compensation + i, before, p);
    else param[i] = static_cast<T>(p);
  }
}

#ifdef KILN_GCC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
template <bool Compensated, class T, class Rule, class... State>
void fused_range_avx2(std::int64_t begin, std::int64_t end, const Rule& rule, T* param, c10::BFloat16* compensation,
                      const T* grad, State*... state) {
  fused_range<8, Compensated>(begin, end, rule, param, compensation, grad, state...);
}
#pragma GCC pop_options
#endif

// fused_serial with the choice of store made: the AVX2 copy where the CPU has it.
template <bool Compensated, class T, class Rule, class... State>
void fused_serial_with(std::int64_t begin, std::int64_t end, const Rule& rule, T* param, c10::BFloat16* compensation,
                       const T* grad, State*... state) {
#ifdef KILN_GCC_X86
  if (cpu_has_avx2()) return fused_range_avx2<Compensated>(begin, end, rule, param, compensation, grad, state...);
#endif
  fused_range<4, Compensated>(begin, end, rule, param, compensation, grad, state...);
}

// One thread's pass over [begin, end), with the widest vectors this CPU has. `compensation` is
// null, or for a bf16 parameter its Kahan compensation buffer (store_compensated).
template <class T, class Rule, class... State>
void fused_serial(std::int64_t begin, std::int64_t end, const Rule& rule, T* param, c10::BFloat16* compensation,
                  const T* grad, State*... state) {
  static_assert((std::is_same_v<State, float> && ...), "optimizer state buffers are fp32");
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    if (compensation != nullptr) return fused_serial_with<true>(begin, end, rule, param, compensation, grad, state...);
  fused_serial_with<false>(begin, end, rule, param, nullptr, grad, state...);
}

// rule(p, g, state...) over n elements, split over LibTorch's intra-op threads. T is the
// parameter/gradient storage type (float or c10::BFloat16); state buffers are float.
template <class T, class Rule, class... State>
void fused_loop(std::int64_t n, const Rule& rule, T* param, c10::BFloat16* compensation, const T* grad,
                State*... state) {
  at::parallel_for(0, n, kiln::detail::chunk_elements, [&](std::int64_t begin, std::int64_t end) {
    fused_serial(begin, end, rule, param, compensation, grad, state...);
  });
}

// The same rules over whole tensors, one LibTorch op per arithmetic operation, for tensors the
// CPU loop cannot reach (CUDA). Each op rounds to fp32 as the loop's lanes do, so on CPU the
// two agree bit for bit (tested), which is how this path is checked on machines without a GPU.
// The square root correctly rounded, as the loop's lanes and CUDA's sqrtf take it. LibTorch 2.x's
// CPU fp32 sqrt is not (2.14: 17% of 100k random values one ulp off the rounded exact root;
// 1.13's is exact), so on the CPU the root is taken in fp64 and rounded once, which is exact.
inline torch::Tensor vsqrt(const torch::Tensor& x) {
  if (kiln::detail::torch_version_major >= 2 && x.device().is_cpu() && x.scalar_type() == torch::kFloat32)
    return x.to(torch::kFloat64).sqrt().to(torch::kFloat32);
  return x.sqrt();
}
inline torch::Tensor vmax(const torch::Tensor& a, const torch::Tensor& b) { return torch::maximum(a, b); }
inline torch::Tensor vsign(const torch::Tensor& x) { return x.sign(); }

// Writes fp32 `updated` into the parameter (rounded to nearest even for bf16, as the loop's
// store), or where `compensation` is defined (a bf16 parameter's Kahan buffer), as the loop's
// store_compensated does, in the same fp32 operations.
inline void store_updated(const torch::Tensor& param, const torch::Tensor& compensation, const torch::Tensor& updated) {
  if (!compensation.defined()) {
    param.copy_(updated);
    return;
  }
  const auto before = param.to(torch::kFloat32);
  const auto sum = before + ((updated - before) + compensation.to(torch::kFloat32));
  param.copy_(sum);
  compensation.copy_(sum - param.to(torch::kFloat32));
}

// rule(p, g, state...) with fp32 tensors, written back into the parameter (store_updated) and
// the fp32 state.
template <class Rule, class... State>
void tensor_rule(const Rule& rule, const torch::Tensor& param, const torch::Tensor& compensation,
                 const torch::Tensor& grad, const State&... state) {
  static_assert((std::is_same_v<State, torch::Tensor> && ...), "optimizer state is held in tensors");
  // The rule assigns new tensors to these handles; the originals are written once at the end.
  auto p = param.to(torch::kFloat32);
  const auto g = grad.to(torch::kFloat32);
  std::array<torch::Tensor, sizeof...(State)> values{state...};
  std::apply([&](auto&... s) { rule(p, g, s...); }, values);
  store_updated(param, compensation, p);
  [[maybe_unused]] std::size_t i = 0;
  ((void)state.copy_(values[i++]), ...);
}

}  // namespace kiln::optim::detail
