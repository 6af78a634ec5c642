// kiln/detail/simd.hpp: the vector types and loads/stores kiln's hand-fused CPU loops share
// (the optimizers' update rules, dropout, cross-entropy).
//
// Why not at::vec::Vectorized: its fast paths exist only where the including file is compiled
// with CPU_CAPABILITY_AVX2 (ATen compiles its kernels once per capability and picks one at run
// time). In a user's translation unit with Debian's default flags it falls back to loops over
// one element at a time, and `kiln bench optimizers` measured kiln's AdamW at a fifth of memory
// speed that way. GCC's vector extensions give the same one-body-for-all-widths shape, and their
// code is generated for whatever instruction set the *calling* function is compiled for. So each
// loop is compiled twice: once for the x86-64 baseline (SSE2, 4 lanes of 32 bits) and once inside
// a `target("avx2")` region (8 lanes), chosen once per process from the CPU (cpu_has_avx2);
// bodies written outside that region are inlined into both. Elsewhere (other CPUs, Clang) the
// baseline alone.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

// GCC on x86-64: the baseline is SSE2, and an AVX2 copy is chosen at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_GCC_X86 1
#endif

namespace kiln::detail {

// GCC vector types of 4 and 8 lanes (a vector_size attribute on an alias template would be
// dropped, hence the spelled-out sets).
template <int Width>
struct lanes;
template <>
struct lanes<4> {
  typedef float f32 __attribute__((vector_size(16)));
  typedef std::uint32_t u32 __attribute__((vector_size(16)));
  typedef std::int32_t i32 __attribute__((vector_size(16)));
  typedef std::uint64_t u64 __attribute__((vector_size(32)));
  typedef std::uint16_t u16 __attribute__((vector_size(8)));
  typedef std::uint8_t u8 __attribute__((vector_size(4)));
};
template <>
struct lanes<8> {
  typedef float f32 __attribute__((vector_size(32)));
  typedef std::uint32_t u32 __attribute__((vector_size(32)));
  typedef std::int32_t i32 __attribute__((vector_size(32)));
  typedef std::uint64_t u64 __attribute__((vector_size(64)));
  typedef std::uint16_t u16 __attribute__((vector_size(16)));
  typedef std::uint8_t u8 __attribute__((vector_size(8)));
};
template <int Width>
using float_vec = typename lanes<Width>::f32;
template <int Width>
using u32_vec = typename lanes<Width>::u32;
template <int Width>
using i32_vec = typename lanes<Width>::i32;
template <int Width>
using u64_vec = typename lanes<Width>::u64;
template <int Width>
using u16_vec = typename lanes<Width>::u16;
template <int Width>
using u8_vec = typename lanes<Width>::u8;

template <class V>
inline constexpr int width_of = sizeof(V) / sizeof(float);

// One vector of fp32 from storage of float or bf16 (widened: bf16 is fp32's upper half).
template <class V, class T>
[[gnu::always_inline]] inline V load(const T* src) {
  constexpr int width = width_of<V>;
  V out;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&out, src, sizeof(V));
  } else {
    u16_vec<width> half;
    std::memcpy(&half, src, sizeof(half));
    const u32_vec<width> bits = __builtin_convertvector(half, u32_vec<width>) << 16;
    std::memcpy(&out, &bits, sizeof(V));
  }
  return out;
}

// One vector of fp32 into storage of float or bf16 (rounded to nearest even, NaN to 0x7FC0, as
// c10::BFloat16 does).
template <class V, class T>
[[gnu::always_inline]] inline void store(T* dst, const V& x) {
  constexpr int width = width_of<V>;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, &x, sizeof(V));
  } else {
    u32_vec<width> bits;
    std::memcpy(&bits, &x, sizeof(V));
    bits = (bits + (((bits >> 16) & 1u) + 0x7FFFu)) >> 16;
    bits = x != x ? u32_vec<width>{} + 0x7FC0u : bits;
    const u16_vec<width> half = __builtin_convertvector(bits, u16_vec<width>);
    std::memcpy(dst, &half, sizeof(half));
  }
}

#ifdef KILN_GCC_X86
inline bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

}  // namespace kiln::detail
