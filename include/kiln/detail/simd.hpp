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
// baseline alone. (Dropout's random bits have an AVX-512 copy as well: dropout_kernel.hpp.)
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

// GCC on x86-64: the baseline is SSE2, and an AVX2 copy is chosen at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_GCC_X86 1
#endif

namespace kiln::detail {

// GCC vector types of 4, 8 and 16 lanes (a vector_size attribute on an alias template would be
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
template <>
struct lanes<16> {
  typedef float f32 __attribute__((vector_size(64)));
  typedef std::uint32_t u32 __attribute__((vector_size(64)));
  typedef std::int32_t i32 __attribute__((vector_size(64)));
  typedef std::uint64_t u64 __attribute__((vector_size(128)));
  typedef std::uint16_t u16 __attribute__((vector_size(32)));
  typedef std::uint8_t u8 __attribute__((vector_size(16)));
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

// The storage types the loads and stores take.
template <class T>
inline constexpr bool is_lane_storage =
    std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;

// The same, as a tensor's dtype: the tensors a fused kernel can take.
inline bool is_lane_dtype(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Float || dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half;
}

// f(std::type_identity<T>{}) with T the storage type of `dtype`, one is_lane_dtype accepts.
template <class F>
void with_lane_storage(c10::ScalarType dtype, F&& f) {
  if (dtype == c10::ScalarType::Float) f(std::type_identity<float>{});
  else if (dtype == c10::ScalarType::BFloat16) f(std::type_identity<c10::BFloat16>{});
  else if (dtype == c10::ScalarType::Half) f(std::type_identity<c10::Half>{});
  else throw std::invalid_argument(std::string("kiln: no vector loop takes ") + c10::toString(dtype) + " tensors");
}

// Elements per thread chunk of kiln's parallel loops (optimizer updates, dropout, cross-entropy,
// LayerNorm): big enough that a chunk is tens of microseconds of memory traffic.
inline constexpr std::int64_t chunk_elements = 1 << 15;

// Rows of `row_length` elements per chunk, at least one.
inline std::int64_t chunk_rows(std::int64_t row_length) {
  return std::max<std::int64_t>(1, chunk_elements / std::max<std::int64_t>(row_length, 1));
}

// The sum of a vector's lanes, in lane order.
template <class V>
[[gnu::always_inline]] inline float lanes_sum(const V& v) {
  float s = 0.0f;
  for (int i = 0; i < width_of<V>; ++i) s += v[i];
  return s;
}

// A vector's bits as another vector type of the same size.
template <class To, class From>
[[gnu::always_inline]] inline To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// IEEE binary16 bits (in the low half of each lane) to fp32, exactly; the branch-free algorithm
// of Marat Dukhan's FP16 library, which c10::Half's software conversion is, done lane by lane.
template <class V>
[[gnu::always_inline]] inline V widen_half(const u32_vec<width_of<V>>& h) {
  using U = u32_vec<width_of<V>>;
  const U w = h << 16;
  const U sign = w & 0x80000000u;
  const U two_w = w + w;
  // Normal numbers, infinities and NaN: re-bias the exponent by 112, then scale by 2^-112.
  const V normalized = bits_as<V>((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormals: the mantissa placed under an exponent of 2^-1, less 0.5.
  const V subnormal = bits_as<V>((two_w >> 17) | (126u << 23)) - 0.5f;
  return bits_as<V>(sign | (two_w < (1u << 27) ? bits_as<U>(subnormal) : bits_as<U>(normalized)));
}

// fp32 to binary16 bits (in the low half of each lane), rounded to nearest even, overflow to
// infinity, NaN to 0x7E00: c10::Half's software conversion, lane by lane. The rounding is done
// by the FPU: adding 2^(e+13) (e: the value's exponent, at least -14) leaves exactly the bits
// binary16 keeps, rounded as fp32 addition rounds.
template <class V>
[[gnu::always_inline]] inline u32_vec<width_of<V>> narrow_to_half(const V& f) {
  using U = u32_vec<width_of<V>>;
  const U w = bits_as<U>(f);
  const U shl1_w = w + w;
  const U sign = w & 0x80000000u;
  // |f| scaled up by 2^112 and down by 2^-110: infinity for values binary16 cannot hold.
  const V magnitude = bits_as<V>(w & 0x7FFFFFFFu) * 0x1.0p+112f * 0x1.0p-110f;
  U bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? U{} + 0x71000000u : bias;
  const U bits = bits_as<U>(bits_as<V>((bias >> 1) + 0x07800000u) + magnitude);
  const U nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  return (sign >> 16) | (shl1_w > 0xFF000000u ? U{} + 0x7E00u : nonsign);
}

// One vector of fp32 from storage of float, bf16 (widened: bf16 is fp32's upper half) or fp16.
template <class V, class T>
[[gnu::always_inline]] inline V load(const T* src) {
  static_assert(is_lane_storage<T>, "kiln's vector loops take float, c10::BFloat16 or c10::Half storage");
  constexpr int width = width_of<V>;
  if constexpr (std::is_same_v<T, float>) {
    V out;
    std::memcpy(&out, src, sizeof(V));
    return out;
  } else {
    u16_vec<width> narrow;
    std::memcpy(&narrow, src, sizeof(narrow));
    const u32_vec<width> bits = __builtin_convertvector(narrow, u32_vec<width>);
    if constexpr (std::is_same_v<T, c10::BFloat16>) return bits_as<V>(bits << 16);
    else return widen_half<V>(bits);
  }
}

// One vector of fp32 into storage of float, bf16 (rounded to nearest even, NaN to 0x7FC0, as
// c10::BFloat16 does) or fp16 (rounded as c10::Half does: narrow_to_half).
template <class V, class T>
[[gnu::always_inline]] inline void store(T* dst, const V& x) {
  static_assert(is_lane_storage<T>, "kiln's vector loops take float, c10::BFloat16 or c10::Half storage");
  constexpr int width = width_of<V>;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, &x, sizeof(V));
  } else {
    u32_vec<width> bits;
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      bits = bits_as<u32_vec<width>>(x);
      bits = (bits + (((bits >> 16) & 1u) + 0x7FFFu)) >> 16;
      bits = x != x ? u32_vec<width>{} + 0x7FC0u : bits;
    } else {
      bits = narrow_to_half(x);
    }
    const u16_vec<width> narrow = __builtin_convertvector(bits, u16_vec<width>);
    std::memcpy(dst, &narrow, sizeof(narrow));
  }
}

#ifdef KILN_GCC_X86
inline bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
// AVX-512 Foundation (and the OS saving its registers): dropout's Philox has a copy for it.
inline bool cpu_has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

}  // namespace kiln::detail
