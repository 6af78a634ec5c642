// kiln/optim/detail/fused_loop.hpp: one pass over a parameter, its gradient and its state
// buffers, vectorised with at::vec::Vectorized<float> and split over threads with
// at::parallel_for: the shape of every fused update rule in kiln::optim.
//
// An update rule is written once as a generic lambda over `V` (Vectorized<float> or float):
//
//   fused_loop(n, [&](auto& p, const auto& g, auto& m) { m = m * b + g * (1 - b); p = p - m * lr; },
//              param_ptr, grad_ptr, state_ptr);
//
// The lambda sees the parameter and gradient as fp32 whatever their storage (fp32 or bf16;
// bf16 is widened on load and rounded to nearest-even on store), and each state buffer as fp32.
// The vector body runs on whole vectors, the same lambda on plain floats for the tail, so both
// paths compute the same formula.
#pragma once

#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <type_traits>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

namespace kiln::optim::detail {

using fvec = at::vec::Vectorized<float>;

// Elements per thread chunk: big enough that a chunk is ~100 us of memory traffic.
inline constexpr std::int64_t fused_grain = 1 << 15;

// The few non-arithmetic operations update rules need, for both vectors and scalars.
inline fvec vsqrt(const fvec& x) { return x.sqrt(); }
inline float vsqrt(float x) { return std::sqrt(x); }
inline fvec vmax(const fvec& a, const fvec& b) { return at::vec::maximum(a, b); }
inline float vmax(float a, float b) { return std::max(a, b); }
inline fvec vsign(const fvec& x) { return x.gt(fvec(0.f)) - x.lt(fvec(0.f)); }
inline float vsign(float x) { return static_cast<float>((x > 0.f) - (x < 0.f)); }

// Two vectors of fp32 from 2 x fvec::size() elements of T, and back.
template <class T>
inline void load_pair(const T* src, fvec& a, fvec& b) {
  if constexpr (std::is_same_v<T, float>) {
    a = fvec::loadu(src);
    b = fvec::loadu(src + fvec::size());
  } else {
    std::tie(a, b) = at::vec::convert_bfloat16_float(at::vec::Vectorized<c10::BFloat16>::loadu(src));
  }
}
template <class T>
inline void store_pair(T* dst, const fvec& a, const fvec& b) {
  if constexpr (std::is_same_v<T, float>) {
    a.store(dst);
    b.store(dst + fvec::size());
  } else {
    at::vec::convert_float_bfloat16(a, b).store(dst);
  }
}

// Runs rule(p, g, state...) over n elements. T is the parameter/gradient storage type
// (float or c10::BFloat16); state buffers are float.
template <class T, class Rule, class... State>
void fused_loop(std::int64_t n, Rule rule, T* param, const T* grad, State*... state) {
  static_assert((std::is_same_v<State, float> && ...), "optimizer state buffers are fp32");
  constexpr std::int64_t width = 2 * fvec::size();
  at::parallel_for(0, n, fused_grain, [&](std::int64_t begin, std::int64_t end) {
    std::int64_t i = begin;
    for (; i + width <= end; i += width) {
      fvec p0, p1, g0, g1;
      load_pair(param + i, p0, p1);
      load_pair(grad + i, g0, g1);
      auto low = std::make_tuple(fvec::loadu(state + i)...);
      auto high = std::make_tuple(fvec::loadu(state + i + fvec::size())...);
      std::apply([&](auto&... s) { rule(p0, g0, s...); }, low);
      std::apply([&](auto&... s) { rule(p1, g1, s...); }, high);
      store_pair(param + i, p0, p1);
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        float* out[] = {state..., nullptr};
        ((std::get<K>(low).store(out[K] + i), std::get<K>(high).store(out[K] + i + fvec::size())), ...);
      }(std::index_sequence_for<State...>{});
    }
    for (; i < end; ++i) {
      float p = static_cast<float>(param[i]);
      rule(p, static_cast<float>(grad[i]), state[i]...);
      param[i] = static_cast<T>(p);
    }
  });
}

}  // namespace kiln::optim::detail
