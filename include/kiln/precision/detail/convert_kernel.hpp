// kiln/precision/detail/convert_kernel.hpp: fp32 <-> bf16 / fp16 conversion of a CPU tensor in one
// vector pass, for the bf16 matmuls computed in fp32 (cpu_bf16.hpp).
//
// Why: those matmuls widen their bf16 operands and round their product, and LibTorch 1.13's
// dtype-converting copy_ goes element by element through c10::BFloat16's scalar conversion.
// `kiln profile recipes/mixed-precision.toml` on an AMD EPYC (AVX2) put aten::copy_ at 23% of the
// bf16 step (fp32: 6%). The loops here are simd.hpp's load/store (exact widening; rounding to
// nearest even, NaN kept, as c10::BFloat16 and c10::Half do), so the result is bit for bit
// LibTorch's. A tensor whose elements fill its storage span with no overlap (contiguous, or a
// transpose or permutation of one, as matmul operands often are) keeps its strides; any other
// layout goes to LibTorch's copy.
#pragma once

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "kiln/detail/simd.hpp"

namespace kiln::precision::detail {

template <int Width, class From, class To>
[[gnu::always_inline]] inline void convert_range(const From* src, To* dst, std::int64_t first, std::int64_t last) {
  using V = kiln::detail::float_vec<Width>;
  std::int64_t i = first;
  for (; i + Width <= last; i += Width) kiln::detail::store<V>(dst + i, kiln::detail::load<V>(src + i));
  for (; i < last; ++i) dst[i] = static_cast<To>(static_cast<float>(src[i]));
}

#ifdef KILN_GCC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
template <class From, class To>
void convert_avx2(const From* src, To* dst, std::int64_t first, std::int64_t last) {
  convert_range<8>(src, dst, first, last);
}
#pragma GCC pop_options
#endif

// Whether convert_cpu takes `t` to `dtype` itself (otherwise: t.to(dtype)).
inline bool fast_conversion_applies(const at::Tensor& t, at::ScalarType dtype) {
  return t.device().is_cpu() && t.scalar_type() != dtype && kiln::detail::is_lane_dtype(t.scalar_type()) &&
         kiln::detail::is_lane_dtype(dtype) && t.is_non_overlapping_and_dense() && !t.is_conj() && !t.is_neg();
}

// t as `dtype`: a new tensor with t's sizes and strides; autograd does not see the conversion
// (callers sit below it).
inline at::Tensor convert_cpu(const at::Tensor& t, at::ScalarType dtype) {
  if (t.scalar_type() == dtype) return t;
  if (!fast_conversion_applies(t, dtype)) return t.to(dtype);
  auto out = at::empty_strided(t.sizes(), t.strides(), t.options().dtype(dtype));
  // Non-overlapping and dense: the elements are the numel() slots from the lowest address, in
  // some order, and `out` (same strides) puts each at the same offset.
  const std::int64_t n = t.numel();
  kiln::detail::with_lane_storage(t.scalar_type(), [&]<class From>(std::type_identity<From>) {
    kiln::detail::with_lane_storage(dtype, [&]<class To>(std::type_identity<To>) {
      const From* src = t.data_ptr<From>();
      To* dst = out.data_ptr<To>();
      if constexpr (!std::is_same_v<From, To>) {
        at::parallel_for(0, n, kiln::detail::chunk_elements, [&](std::int64_t first, std::int64_t last) {
#ifdef KILN_GCC_X86
          if (kiln::detail::cpu_has_avx2()) return convert_avx2(src, dst, first, last);
#endif
          convert_range<4>(src, dst, first, last);
        });
      }
    });
  });
  return out;
}

}  // namespace kiln::precision::detail
