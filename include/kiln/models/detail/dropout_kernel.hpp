// kiln/models/detail/dropout_kernel.hpp: dropout's CPU kernels, one pass each way, with the
// random bits from Philox4x32-10 instead of LibTorch's Bernoulli sampler.
//
// Why: LibTorch's CPU dropout draws its mask with bernoulli_, which in a build without MKL
// (Debian's) samples one element at a time from the generator's mt19937 on one thread (about
// 5.6 ns an element here), then divides the mask and multiplies: three passes and a 4-byte mask.
// On kiln's gpt that was about a sixth of a training step. Here the mask comes from a counter-
// based generator, so any element's bits are a pure function of (seed, index): the loop runs
// vectorised and on every thread, and the result does not depend on how it was split; and the
// backward recomputes the mask from the call's 64-bit key instead of keeping it (the idea of
// FlashAttention's and cuDNN's dropout), so dropout holds no memory between forward and backward.
// Each direction is one pass: out = kept ? in * scale : 0.
//
// The generator: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), the one behind PyTorch's and cuRAND's GPU dropout; it passes TestU01's BigCrush.
// Each call takes a fresh 64-bit key from LibTorch's CPU generator, so torch::manual_seed
// reproduces masks, saved RNG states resume them, and activation checkpointing (which restores
// that generator before recomputing) redraws the same masks.
//
// Layout: elements come in groups of 32. Group g is Philox blocks 8g .. 8g+7 (counter = block
// number, key = the call's seed); word w of block 8g + j is the random word of element
// 32g + 8w + j, so 8 blocks computed side by side in vector lanes give 4 contiguous runs of
// 8 elements. An element is kept when its word is below keep_threshold = floor((1 - p) 2^32).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/torch.h>

#include "kiln/detail/simd.hpp"

namespace kiln::detail {

inline constexpr std::uint32_t philox_m0 = 0xD2511F53u, philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u, philox_w1 = 0xBB67AE85u;

// hi:lo = a * m for each 32-bit lane. x86: pmuludq multiplies the even lanes into 64 bits; a
// second one takes the odd lanes shifted down, and blends put the halves back in lane order.
// (Written as a 64-bit vector multiply, GCC turns the constant into shift-and-add chains that
// cost several times more.)
template <class U>
[[gnu::always_inline]] inline void mulhilo(const U& a, std::uint32_t m, U& hi, U& lo) {
  using u64 = u64_vec<sizeof(U) / 4>;
  const u64 p = __builtin_convertvector(a, u64) * std::uint64_t{m};
  hi = __builtin_convertvector(p >> 32, U);
  lo = __builtin_convertvector(p, U);
}
#ifdef KILN_GCC_X86
typedef int philox_i32x4 __attribute__((vector_size(16)));
typedef std::uint64_t philox_u64x2 __attribute__((vector_size(16)));
[[gnu::always_inline]] inline void mulhilo(const u32_vec<4>& a, std::uint32_t m, u32_vec<4>& hi, u32_vec<4>& lo) {
  const philox_i32x4 mv = philox_i32x4{} + static_cast<int>(m);
  const auto even = (u32_vec<4>)__builtin_ia32_pmuludq128((philox_i32x4)a, mv);
  const auto odd = (u32_vec<4>)__builtin_ia32_pmuludq128((philox_i32x4)((philox_u64x2)a >> 32), mv);
  hi = __builtin_shufflevector(even, odd, 1, 5, 3, 7);
  lo = __builtin_shufflevector(even, odd, 0, 4, 2, 6);
}
// 8 lanes as two halves of 4 (SSE2 builtins: a template is compiled for the baseline before
// it is inlined into the AVX2 copy, so it cannot call AVX2 builtins itself).
[[gnu::always_inline]] inline void mulhilo(const u32_vec<8>& a, std::uint32_t m, u32_vec<8>& hi, u32_vec<8>& lo) {
  u32_vec<4> hi_low, lo_low, hi_high, lo_high;
  mulhilo(u32_vec<4>(__builtin_shufflevector(a, a, 0, 1, 2, 3)), m, hi_low, lo_low);
  mulhilo(u32_vec<4>(__builtin_shufflevector(a, a, 4, 5, 6, 7)), m, hi_high, lo_high);
  hi = __builtin_shufflevector(hi_low, hi_high, 0, 1, 2, 3, 4, 5, 6, 7);
  lo = __builtin_shufflevector(lo_low, lo_high, 0, 1, 2, 3, 4, 5, 6, 7);
}
#endif

// Philox4x32-10 on `Width` counters at once (lane j of c0..c3 is one counter), in place.
template <int Width>
[[gnu::always_inline]] inline void philox_rounds(u32_vec<Width>& c0, u32_vec<Width>& c1, u32_vec<Width>& c2,
                                                 u32_vec<Width>& c3, std::uint32_t k0, std::uint32_t k1) {
  using u32 = u32_vec<Width>;
  for (int round = 0; round < 10; ++round) {
    u32 hi0, lo0, hi1, lo1;
    mulhilo(c0, philox_m0, hi0, lo0);
    mulhilo(c2, philox_m1, hi1, lo1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += philox_w0;
    k1 += philox_w1;
  }
}

// The 32 random words of group `group` under `seed`, in element order (see the layout above).
template <int Width>
[[gnu::always_inline]] inline void philox_group(std::uint64_t seed, std::uint64_t group, std::uint32_t* words) {
  u32_vec<Width> lane;
  for (int j = 0; j < Width; ++j) lane[j] = static_cast<std::uint32_t>(j);
  for (int half = 0; half < 8 / Width; ++half) {
    // 8 * group is a multiple of 8, so adding a lane number (< 8) never carries into c1.
    const std::uint64_t first = 8 * group + static_cast<std::uint64_t>(half * Width);
    u32_vec<Width> c0 = lane + static_cast<std::uint32_t>(first);
    u32_vec<Width> c1 = u32_vec<Width>{} + static_cast<std::uint32_t>(first >> 32);
    u32_vec<Width> c2{}, c3{};
    philox_rounds<Width>(c0, c1, c2, c3, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
    const std::array<const u32_vec<Width>*, 4> word{&c0, &c1, &c2, &c3};
    for (int w = 0; w < 4; ++w) std::memcpy(words + 8 * w + half * Width, word[w], sizeof(u32_vec<Width>));
  }
}

// Philox4x32-10 of one counter under one key: the kernel's own rounds, for known-answer tests.
inline std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key) {
  u32_vec<4> c0{}, c1{}, c2{}, c3{};
  c0[0] = counter[0], c1[0] = counter[1], c2[0] = counter[2], c3[0] = counter[3];
  philox_rounds<4>(c0, c1, c2, c3, key[0], key[1]);
  return {c0[0], c1[0], c2[0], c3[0]};
}

// Everything that decides one call's mask: forward and backward recompute it from these alone,
// so nothing per element is kept for backward.
struct dropout_mask {
  std::uint64_t seed;
  std::uint32_t keep_threshold;  // an element is kept when its word is below this
  float scale;                   // 1 / (1 - p)
};

inline constexpr std::int64_t dropout_group_size = 32;

// y where `kept` is all ones, +0.0 where it is zero (lane by lane, on the bits).
template <class V, class U>
[[gnu::always_inline]] inline V only_kept(const V& y, const U& kept) {
  U bits;
  std::memcpy(&bits, &y, sizeof(U));
  bits &= kept;
  V out;
  std::memcpy(&out, &bits, sizeof(V));
  return out;
}

// out = kept ? in * scale : 0 over the elements of groups [first, last) of n. Forward (in = x)
// and backward (in = the output's gradient) are this same pass under the same mask.
template <int Width, class T>
[[gnu::always_inline]] inline void masked_scale_range(const dropout_mask& m, std::int64_t first, std::int64_t last,
                                                      std::int64_t n, const T* in, T* out) {
  using V = float_vec<Width>;
  using U = u32_vec<Width>;
  alignas(32) std::uint32_t words[dropout_group_size];
  for (std::int64_t g = first; g < last; ++g) {
    philox_group<Width>(m.seed, static_cast<std::uint64_t>(g), words);
    const std::int64_t base = g * dropout_group_size;
    if (base + dropout_group_size <= n) {
      for (int k = 0; k < dropout_group_size; k += Width) {
        U r;
        std::memcpy(&r, words + k, sizeof(U));
        const U kept = (U)(r < m.keep_threshold);  // all ones where kept
        store<V>(out + base + k, only_kept(load<V>(in + base + k) * m.scale, kept));
      }
    } else {  // the last, partial group
      for (std::int64_t i = base; i < n; ++i)
        out[i] = static_cast<T>(words[i - base] < m.keep_threshold ? static_cast<float>(in[i]) * m.scale : 0.0f);
    }
  }
}

#ifdef KILN_GCC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
template <class T>
void masked_scale_avx2(const dropout_mask& m, std::int64_t first, std::int64_t last, std::int64_t n, const T* in,
                       T* out) {
  masked_scale_range<8>(m, first, last, n, in, out);
}
#pragma GCC pop_options
#endif

// Groups per thread chunk: simd.hpp's chunk_elements.
inline constexpr std::int64_t dropout_grain_groups = chunk_elements / dropout_group_size;

template <class T>
void masked_scale_loop(const dropout_mask& m, std::int64_t n, const T* in, T* out) {
  const std::int64_t groups = (n + dropout_group_size - 1) / dropout_group_size;
  at::parallel_for(0, groups, dropout_grain_groups, [&](std::int64_t first, std::int64_t last) {
#ifdef KILN_GCC_X86
    if (cpu_has_avx2()) return masked_scale_avx2(m, first, last, n, in, out);
#endif
    masked_scale_range<4>(m, first, last, n, in, out);
  });
}

// Whether the fused kernels take this tensor; others go to LibTorch's dropout.
inline bool fused_dropout_applies(const torch::Tensor& x) {
  return x.device().is_cpu() && is_lane_dtype(x.scalar_type());
}

// A fresh mask for dropout probability p (0 < p < 1): its key comes from LibTorch's default CPU
// generator, advancing it as any draw would.
inline dropout_mask draw_dropout_mask(double p) {
  auto* generator = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  std::uint64_t seed = 0;
  {
    std::lock_guard<std::mutex> lock(generator->mutex_);
    seed = generator->random64();
  }
  const double kept = std::ldexp(1.0 - p, 32);
  return {.seed = seed,
          .keep_threshold = kept >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(kept),
          .scale = static_cast<float>(1.0 / (1.0 - p))};
}

// `in` (CPU, fp32, bf16 or fp16) with the mask applied, as a new contiguous tensor of its dtype: the
// forward with in = x, the backward with in = the output's gradient.
inline torch::Tensor apply_dropout_mask(const torch::Tensor& input, const dropout_mask& m) {
  const auto in = input.contiguous();
  auto out = torch::empty_like(in, torch::MemoryFormat::Contiguous);
  with_lane_storage(in.scalar_type(), [&]<class T>(std::type_identity<T>) {
    masked_scale_loop(m, in.numel(), in.data_ptr<T>(), out.data_ptr<T>());
  });
  return out;
}

}  // namespace kiln::detail
