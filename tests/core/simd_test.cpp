// Tests for kiln/detail/simd.hpp's conversions between fp32 vector lanes and the 16-bit storage
// types, at both widths the kernels are compiled for, against c10's own scalar conversions
// (c10::Half and c10::BFloat16): every fp16 bit pattern when widening, and when narrowing every
// fp16 value, the midpoints between neighbours (where the rounding rule shows) and the floats
// next to them, overflow, subnormals and random floats over the whole exponent range.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kiln/detail/simd.hpp"

#include <doctest/doctest.h>

namespace {

namespace d = kiln::detail;

float float_of_half_bits(std::uint16_t bits) { return static_cast<float>(c10::Half(bits, c10::Half::from_bits())); }
std::uint16_t half_bits_of(float value) { return c10::Half(value).x; }
std::uint16_t bf16_bits_of(float value) { return c10::BFloat16(value).x; }
bool is_half_nan(std::uint16_t bits) { return (bits & 0x7C00u) == 0x7C00u && (bits & 0x03FFu) != 0; }
bool is_bf16_nan(std::uint16_t bits) { return (bits & 0x7F80u) == 0x7F80u && (bits & 0x007Fu) != 0; }

// values through load<V> from storage T at width W, in chunks of W (the input padded to whole chunks).
template <int W, class T>
std::vector<float> widened(const std::vector<T>& values) {
  std::vector<T> padded(values);
  padded.resize((values.size() + W - 1) / W * W);
  std::vector<float> out(padded.size());
  for (std::size_t i = 0; i < padded.size(); i += W) {
    const auto v = d::load<d::float_vec<W>>(padded.data() + i);
    std::memcpy(out.data() + i, &v, sizeof(v));
  }
  out.resize(values.size());
  return out;
}

// values through store<V> into storage T at width W, as raw bits.
template <int W, class T>
std::vector<std::uint16_t> narrowed(const std::vector<float>& values) {
  std::vector<float> padded(values);
  padded.resize((values.size() + W - 1) / W * W);
  std::vector<T> out(padded.size());
  for (std::size_t i = 0; i < padded.size(); i += W) {
    d::float_vec<W> v;
    std::memcpy(&v, padded.data() + i, sizeof(v));
    d::store(out.data() + i, v);
  }
  std::vector<std::uint16_t> bits(values.size());
  std::memcpy(bits.data(), out.data(), bits.size() * sizeof(std::uint16_t));
  return bits;
}

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Floats where fp16 rounding is decided: every finite half value, the midpoint between it and
// the next (exact in fp32), the floats either side of each, the overflow boundary, values below
// the smallest subnormal, infinities, NaN, and random floats of every exponent.
std::vector<float> rounding_probes() {
  std::vector<float> probes;
  const float inf = std::numeric_limits<float>::infinity();
  for (std::uint32_t h = 0; h < 0x7C00u; ++h) {
    for (const float sign : {1.0f, -1.0f}) {
      const float value = sign * float_of_half_bits(static_cast<std::uint16_t>(h));
      const float next = sign * float_of_half_bits(static_cast<std::uint16_t>(h + 1));  // 0x7C00: infinity
      const float midpoint = h + 1 < 0x7C00u ? (value + next) / 2 : sign * 65520.0f;   // 65520 rounds to inf
      for (const float f : {value, midpoint}) {
        probes.push_back(f);
        probes.push_back(std::nextafter(f, inf));
        probes.push_back(std::nextafter(f, -inf));
      }
    }
  }
  for (const float f : {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1e-30f, -1e-30f, 3e38f, -3e38f,
                        std::ldexp(1.0f, -25), std::ldexp(1.5f, -25), std::ldexp(1.0f, -26)})
    probes.push_back(f);
  std::mt19937 random(12345);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t b = any_bits(random);
    float f;
    std::memcpy(&f, &b, sizeof(f));
    probes.push_back(f);
  }
  return probes;
}

// rounding_probes() through store<V> into T at 4 and at 8 lanes against c10's conversion
// (expected_bits), NaN to any NaN (is_nan): how many lanes differ, the first few reported.
template <class T>
int narrowing_mismatches(std::uint16_t (*expected_bits)(float), bool (*is_nan)(std::uint16_t)) {
  const auto probes = rounding_probes();
  const auto narrow_lanes = narrowed<4, T>(probes), wide_lanes = narrowed<8, T>(probes);
  int mismatches = 0;
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const std::uint16_t expected = expected_bits(probes[i]);
    for (const std::uint16_t got : {narrow_lanes[i], wide_lanes[i]}) {
      const bool same = std::isnan(probes[i]) ? is_nan(got) : got == expected;
      if (!same && ++mismatches <= 5) CHECK_MESSAGE(same, "float ", probes[i], ": expected ", expected, ", got ", got);
    }
  }
  return mismatches;
}

}  // namespace

TEST_SUITE("simd") {
  TEST_CASE("fp16 lanes widen to the float c10::Half gives, for all 65536 bit patterns, at 4 and 8 lanes") {
    std::vector<c10::Half> all(65536);
    for (std::uint32_t h = 0; h < 65536; ++h) all[h] = c10::Half(static_cast<std::uint16_t>(h), c10::Half::from_bits());
    const auto narrow_lanes = widened<4>(all), wide_lanes = widened<8>(all);
    int mismatches = 0;
    for (std::uint32_t h = 0; h < 65536; ++h) {
      const float expected = float_of_half_bits(static_cast<std::uint16_t>(h));
      for (const float got : {narrow_lanes[h], wide_lanes[h]}) {
        const bool same = std::isnan(expected) ? std::isnan(got) : bits_of(got) == bits_of(expected);
        if (!same && ++mismatches <= 5) CHECK_MESSAGE(same, "half bits ", h, ": expected ", expected, ", got ", got);
      }
    }
    CHECK(mismatches == 0);
  }

  TEST_CASE("fp32 lanes narrow to fp16 bits as c10::Half rounds them, at 4 and 8 lanes") {
    CHECK(narrowing_mismatches<c10::Half>(half_bits_of, is_half_nan) == 0);
    // The rule itself, independently of c10: ties go to the even neighbour, overflow to infinity.
    CHECK(narrowed<4, c10::Half>({1.0f + std::ldexp(1.0f, -11)})[0] == 0x3C00u);         // tie: down to even
    CHECK(narrowed<4, c10::Half>({1.0f + 3 * std::ldexp(1.0f, -11)})[0] == 0x3C02u);     // tie: up to even
    CHECK(narrowed<8, c10::Half>({65520.0f, 65519.0f})[0] == 0x7C00u);                   // infinity
    CHECK(narrowed<8, c10::Half>({65520.0f, 65519.0f})[1] == 0x7BFFu);                   // 65504
    CHECK(narrowed<8, c10::Half>({std::ldexp(1.0f, -25), std::ldexp(1.5f, -25)})[0] == 0u);   // tie: to zero
    CHECK(narrowed<8, c10::Half>({std::ldexp(1.0f, -25), std::ldexp(1.5f, -25)})[1] == 1u);   // smallest subnormal
  }

  TEST_CASE("fp32 lanes narrow to bf16 bits as c10::BFloat16 rounds them, at 4 and 8 lanes") {
    CHECK(narrowing_mismatches<c10::BFloat16>(bf16_bits_of, is_bf16_nan) == 0);
  }
}
