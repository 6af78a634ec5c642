// kiln/optim/detail/quantize.hpp: block-wise 8-bit quantization with the dynamic (tree) map of
// Dettmers et al. 2021 (bitsandbytes' create_dynamic_map), as adam8bit stores its moments.
//
// A block of values keeps one fp32 absmax; each value is stored as the index of the map entry
// nearest to value / absmax. The map spends its 256 codes on magnitudes from 1e-6 to 1 with a
// roughly constant number of codes per decade, so small moments keep their relative precision.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <utility>

#include <torch/torch.h>

namespace kiln::optim::detail {

// bitsandbytes.functional.create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8):
// for exponent i in 0..6, the midpoints of linspace(0.1, 1, n_i + 1) scaled by 10^(i - 6), with
// n_i = 2^i (signed, both signs) or 2^(i + 1) (unsigned); plus 0 and 1; sorted.
class dynamic_map {
 public:
  explicit dynamic_map(bool is_signed) {
    std::size_t k = 0;
    for (int i = 0; i < 7; ++i) {
      const int items = is_signed ? (1 << i) : (1 << (i + 1));
      const double scale = std::pow(10.0, i - 6);
      for (int j = 0; j < items; ++j) {
        // midpoint of the j-th interval of linspace(0.1, 1, items + 1), as float32 like torch's
        const float lo = static_cast<float>(0.1 + 0.9 * j / items);
        const float hi = static_cast<float>(0.1 + 0.9 * (j + 1) / items);
        const float mean = (lo + hi) / 2.0f;
        values_[k++] = static_cast<float>(scale * mean);
        if (is_signed) values_[k++] = static_cast<float>(-scale * mean);
      }
    }
    values_[k++] = 0.0f;
    values_[k++] = 1.0f;
    while (k < 256) values_[k++] = 0.0f;  // (unused: both maps fill all 256 codes)
    std::sort(values_.begin(), values_.begin() + 256);
    // values_[k + 1] always exists; as NaN it compares false, so k never passes 255.
    values_[256] = std::numeric_limits<float>::quiet_NaN();
    // For each value of a float's top 16 bits (sign, exponent, 7 mantissa bits): the last entry
    // <= the smallest float with those bits, where encode's search starts, and the most steps
    // up any float with those bits needs (1 for these maps: neighbouring entries are about as
    // far apart as the floats sharing their top 16 bits, or farther).
    auto last_at_or_below = [&](float x) -> unsigned {
      const auto* above = std::upper_bound(values_.data(), values_.data() + 256, x);
      return above == values_.data() || x != x ? 0 : static_cast<unsigned>(above - values_.data() - 1);
    };
    auto as_float = [](std::uint32_t bits) {
      float x;
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    };
    for (std::uint32_t top = 0; top < 65536; ++top) {
      const bool negative = top & 0x8000u;
      const float lowest = as_float(top << 16 | (negative ? 0xFFFFu : 0u));
      const float highest = as_float(top << 16 | (negative ? 0u : 0xFFFFu));
      search_start_[top] = static_cast<std::uint8_t>(last_at_or_below(lowest));
      if (lowest == lowest && highest == highest)  // (NaN buckets: encode answers NaN first)
        steps_ = std::max(steps_, last_at_or_below(highest) - search_start_[top]);
    }
  }

  float decode(std::uint8_t code) const { return values_[code]; }

  // Index of the entry nearest to x (x in [-1, 1] after division by the block's absmax), the
  // lower one on a tie: what a binary search over the sorted entries gives, found without a
  // data-dependent branch (a mispredicted branch per value was most of adam8bit's step time).
  std::uint8_t encode(float x) const {
    if (x != x) return 255;  // as the binary search: nothing compares below NaN
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    unsigned k = search_start_[bits >> 16];
    for (unsigned step = 0; step < steps_; ++step) k += values_[k + 1] <= x;
    // Below every entry k stays 0 (the comparison is false), above the last it stays 255.
    return static_cast<std::uint8_t>(k + (x - values_[k] > values_[k + 1] - x));
  }

  std::span<const float, 256> values() const { return std::span<const float, 256>(values_.data(), 256); }
  unsigned search_steps() const { return steps_; }

 private:
  std::array<float, 257> values_{};
  std::array<std::uint8_t, 65536> search_start_{};
  unsigned steps_ = 0;
};

inline const dynamic_map& signed_map() {
  static const dynamic_map map(true);
  return map;
}
inline const dynamic_map& unsigned_map() {
  static const dynamic_map map(false);
  return map;
}

// Quantizes `n` floats of one block into codes; returns the block's absmax.
inline float quantize_block(const float* x, std::int64_t n, std::uint8_t* codes, const dynamic_map& map) {
  float absmax = 0;
  for (std::int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::abs(x[i]));
  const float inverse = absmax > 0 ? 1.0f / absmax : 0.0f;
  for (std::int64_t i = 0; i < n; ++i) codes[i] = map.encode(x[i] * inverse);
  return absmax;
}
inline void dequantize_block(const std::uint8_t* codes, std::int64_t n, float absmax, float* x, const dynamic_map& map) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = map.decode(codes[i]) * absmax;
}

// Whole-tensor forms (for tests and state inspection): codes (uint8, x's shape) and one absmax
// per block of `block` elements.
inline std::pair<torch::Tensor, torch::Tensor> quantize_blockwise(const torch::Tensor& x, std::int64_t block,
                                                                   const dynamic_map& map) {
  auto flat = x.to(torch::kFloat32).contiguous().reshape({-1});
  const auto n = flat.numel(), blocks = (n + block - 1) / block;
  auto codes = torch::empty(x.sizes(), torch::kUInt8);
  auto absmax = torch::empty({blocks}, torch::kFloat32);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const auto begin = b * block, len = std::min(block, n - begin);
    absmax.data_ptr<float>()[b] =
        quantize_block(flat.data_ptr<float>() + begin, len, codes.data_ptr<std::uint8_t>() + begin, map);
  }
  return {codes, absmax};
}
inline torch::Tensor dequantize_blockwise(const torch::Tensor& codes, const torch::Tensor& absmax, std::int64_t block,
                                          const dynamic_map& map) {
  auto out = torch::empty(codes.sizes(), torch::kFloat32);
  const auto n = codes.numel();
  for (std::int64_t b = 0; b * block < n; ++b) {
    const auto begin = b * block, len = std::min(block, n - begin);
    dequantize_block(codes.data_ptr<std::uint8_t>() + begin, len, absmax.data_ptr<float>()[b],
                     out.data_ptr<float>() + begin, map);
  }
  return out;
}

}  // namespace kiln::optim::detail
