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
// Each direction is one pass: out = kept ? in * scale : 0. Generating the bits is most of that
// pass's work (the multiplies below), so their loop has three copies, for the x86-64 baseline
// (SSE2), AVX2 and AVX-512, picked from the CPU once per process: `./kiln bench dropout` measures
// each against LibTorch's dropout and the copy bound.
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
#include <algorithm>
#include <cstring>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/torch.h>

#include "kiln/detail/simd.hpp"

#ifdef KILN_GCC_X86
#include <immintrin.h>  // the multiplies: _mm_mul_epu32 and its AVX2 and AVX-512 forms
#endif

namespace kiln::detail {

inline constexpr std::uint32_t philox_m0 = 0xD2511F53u, philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u, philox_w1 = 0xBB67AE85u;

// The rounds run on 64-bit lanes, one Philox block per lane, each 32-bit word of the state in the
// low half of its lane. Philox's multiply then is exactly x86's pmuludq (the low halves of two
// 64-bit lanes into a 64-bit product): hi is the product shifted down, lo is the product itself
// (its high half is garbage that the next multiply ignores), and no shuffles are needed. The
// high halves of the other words hold garbage too; only the low halves are ever read.
//
// The multiply comes from a small struct per instruction set: V (the 64-bit-lane vector) and
// mul(a, m) = low32(a) * low32(m) lane by lane. The AVX2 and AVX-512 ones are defined inside
// `target` regions and are plain `inline`, not always_inline: the templates below are compiled for
// the baseline, so GCC may not inline an AVX2 function into them; it inlines it once they have
// been inlined into the region's function. (GCC does not turn a vector multiply of masked or
// zero-extended 64-bit lanes into pmuludq itself: it emits the full 64x64 sequence, three
// multiplies.)
struct philox_generic {
  typedef std::uint64_t V __attribute__((vector_size(16)));
  static constexpr int lanes = 2;
  [[gnu::always_inline]] static void mul(const V& a, const V& m, V& product) { product = (a & 0xFFFFFFFFu) * m; }
};
#ifdef KILN_GCC_X86
struct philox_sse2 {
  typedef std::uint64_t V __attribute__((vector_size(16)));
  static constexpr int lanes = 2;
  [[gnu::always_inline]] static void mul(const V& a, const V& m, V& product) {
    product = (V)_mm_mul_epu32((__m128i)a, (__m128i)m);
  }
};
using philox_baseline = philox_sse2;
#else
using philox_baseline = philox_generic;
#endif

// Philox4x32-10 on Ops::lanes blocks at once (lane j of c0..c3 is one block's counter), in place.
template <class Ops>
[[gnu::always_inline]] inline void philox_rounds(typename Ops::V& c0, typename Ops::V& c1, typename Ops::V& c2,
                                                 typename Ops::V& c3, std::uint32_t k0, std::uint32_t k1) {
  using V = typename Ops::V;
  const V m0 = V{} + philox_m0, m1 = V{} + philox_m1;
  for (int round = 0; round < 10; ++round) {
    V product0, product1;
    Ops::mul(c0, m0, product0);
    Ops::mul(c2, m1, product1);
    c0 = (product1 >> 32) ^ c1 ^ k0;
    c1 = product1;
    c2 = (product0 >> 32) ^ c3 ^ k1;
    c3 = product0;
    k0 += philox_w0;
    k1 += philox_w1;
  }
}

// Groups one call of philox_groups fills: one, or two for AVX-512's 16 blocks.
template <class Ops>
inline constexpr int philox_groups_per_call = Ops::lanes <= 4 ? 1 : Ops::lanes / 4;

// The 32 random words of each of the groups [group, group + philox_groups_per_call<Ops>) under
// `seed`, in element order (see the layout above). The rounds run twice side by side, on the even
// and on the odd blocks, so that joining the two results' low halves, (even | odd << 32), puts the
// words of consecutive blocks in consecutive 32-bit lanes.
template <class Ops>
[[gnu::always_inline]] inline void philox_groups(std::uint64_t seed, std::uint64_t group, std::uint32_t* words) {
  using V = typename Ops::V;
  constexpr int blocks = 2 * Ops::lanes;  // per pass
  constexpr int run = blocks < 8 ? blocks : 8;  // consecutive words per store
  V even_lane;
  for (int j = 0; j < Ops::lanes; ++j) even_lane[j] = static_cast<std::uint64_t>(2 * j);
  const auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int first = 0; first < 8 * philox_groups_per_call<Ops>; first += blocks) {
    const V even = even_lane + (8 * group + static_cast<std::uint64_t>(first)), odd = even + 1u;
    V e0 = even, e1 = even >> 32, e2{}, e3{};
    V o0 = odd, o1 = odd >> 32, o2{}, o3{};
    philox_rounds<Ops>(e0, e1, e2, e3, k0, k1);
    philox_rounds<Ops>(o0, o1, o2, o3, k0, k1);
    const std::array<V, 4> words_in_order{(e0 & 0xFFFFFFFFu) | (o0 << 32), (e1 & 0xFFFFFFFFu) | (o1 << 32),
                                          (e2 & 0xFFFFFFFFu) | (o2 << 32), (e3 & 0xFFFFFFFFu) | (o3 << 32)};
    for (int w = 0; w < 4; ++w) {
      std::uint32_t lane_words[blocks];
      std::memcpy(lane_words, &words_in_order[w], sizeof(lane_words));
      for (int lane = 0; lane < blocks; lane += run) {
        const int block = first + lane;  // counted from group's first block
        std::memcpy(words + 32 * (block / 8) + 8 * w + block % 8, lane_words + lane, run * sizeof(std::uint32_t));
      }
    }
  }
}

// Philox4x32-10 of one counter under one key: the kernel's own rounds, for known-answer tests.
inline std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key) {
  using V = philox_baseline::V;
  V c0{}, c1{}, c2{}, c3{};
  c0[0] = counter[0], c1[0] = counter[1], c2[0] = counter[2], c3[0] = counter[3];
  philox_rounds<philox_baseline>(c0, c1, c2, c3, key[0], key[1]);
  return {static_cast<std::uint32_t>(c0[0]), static_cast<std::uint32_t>(c1[0]), static_cast<std::uint32_t>(c2[0]),
          static_cast<std::uint32_t>(c3[0])};
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

// out = kept ? in * scale : 0 over the elements of groups [first, last) of n, with the words from
// `Ops`'s Philox and Width float lanes. Forward (in = x) and backward (in = the output's gradient)
// are this same pass under the same mask.
template <class Ops, int Width, class T>
[[gnu::always_inline]] inline void masked_scale_range(const dropout_mask& m, std::int64_t first, std::int64_t last,
                                                      std::int64_t n, const T* in, T* out) {
  using V = float_vec<Width>;
  using U = u32_vec<Width>;
  constexpr int groups_per_call = philox_groups_per_call<Ops>;
  alignas(64) std::uint32_t words[groups_per_call * dropout_group_size];
  for (std::int64_t call = first; call < last; call += groups_per_call) {
    // Past `last` a call's second group is computed and ignored.
    philox_groups<Ops>(m.seed, static_cast<std::uint64_t>(call), words);
    for (std::int64_t g = call; g < std::min(call + groups_per_call, last); ++g) {
      const std::uint32_t* group_words = words + (g - call) * dropout_group_size;
      const std::int64_t base = g * dropout_group_size;
      if (base + dropout_group_size <= n) {
        for (int k = 0; k < dropout_group_size; k += Width) {
          U r;
          std::memcpy(&r, group_words + k, sizeof(U));
          const U kept = (U)(r < m.keep_threshold);  // all ones where kept
          store<V>(out + base + k, only_kept(load<V>(in + base + k) * m.scale, kept));
        }
      } else {  // the last, partial group
        for (std::int64_t i = base; i < n; ++i)
          out[i] = static_cast<T>(group_words[i - base] < m.keep_threshold ? static_cast<float>(in[i]) * m.scale : 0.0f);
      }
    }
  }
}

// One function per instruction set, each the kernel compiled for it; masked_scale_loop picks one
// from the CPU. (Tests call each directly, so each is checked on every machine that can run it.)
template <class T>
void masked_scale_baseline(const dropout_mask& m, std::int64_t first, std::int64_t last, std::int64_t n, const T* in,
                           T* out) {
  masked_scale_range<philox_baseline, 4>(m, first, last, n, in, out);
}

#ifdef KILN_GCC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
struct philox_avx2 {
  typedef std::uint64_t V __attribute__((vector_size(32)));
  static constexpr int lanes = 4;
  static void mul(const V& a, const V& m, V& product) { product = (V)_mm256_mul_epu32((__m256i)a, (__m256i)m); }
};
template <class T>
void masked_scale_avx2(const dropout_mask& m, std::int64_t first, std::int64_t last, std::int64_t n, const T* in,
                       T* out) {
  masked_scale_range<philox_avx2, 8>(m, first, last, n, in, out);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
struct philox_avx512 {
  typedef std::uint64_t V __attribute__((vector_size(64)));
  static constexpr int lanes = 8;
  static void mul(const V& a, const V& m, V& product) { product = (V)_mm512_mul_epu32((__m512i)a, (__m512i)m); }
};
template <class T>
void masked_scale_avx512(const dropout_mask& m, std::int64_t first, std::int64_t last, std::int64_t n, const T* in,
                         T* out) {
  masked_scale_range<philox_avx512, 16>(m, first, last, n, in, out);
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
    if (cpu_has_avx512()) return masked_scale_avx512(m, first, last, n, in, out);
    if (cpu_has_avx2()) return masked_scale_avx2(m, first, last, n, in, out);
#endif
    masked_scale_baseline(m, first, last, n, in, out);
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

// A mask travels from forward to backward in the node's saved data: three numbers, no tensor.
inline void save_dropout_mask(torch::autograd::AutogradContext* ctx, const dropout_mask& m) {
  ctx->saved_data["seed"] = static_cast<std::int64_t>(m.seed);
  ctx->saved_data["keep_threshold"] = static_cast<std::int64_t>(m.keep_threshold);
  ctx->saved_data["scale"] = static_cast<double>(m.scale);
}
inline dropout_mask saved_dropout_mask(torch::autograd::AutogradContext* ctx) {
  return {.seed = static_cast<std::uint64_t>(ctx->saved_data["seed"].toInt()),
          .keep_threshold = static_cast<std::uint32_t>(ctx->saved_data["keep_threshold"].toInt()),
          .scale = static_cast<float>(ctx->saved_data["scale"].toDouble())};
}

// The autograd node: keeps only the mask's key, and masks and scales the gradient with the
// mask recomputed from it.
struct dropout_function : torch::autograd::Function<dropout_function> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, double p) {
    const auto mask = draw_dropout_mask(p);
    save_dropout_mask(ctx, mask);
    return apply_dropout_mask(x, mask);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {apply_dropout_mask(grads[0], saved_dropout_mask(ctx)), torch::Tensor()};
  }
};

}  // namespace kiln::detail
