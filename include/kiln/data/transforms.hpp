// kiln/data/transforms.hpp: per-sample transforms the loader's workers apply before collating.
//
// A transform is a callable `void(example&, sample_rng& rng)`. The loader seeds `rng` from
// (seed, epoch, the sample's position in the epoch, rank), so a sample's augmentation does not
// depend on which worker made it or on how many workers there are. compose(a, b, ...) applies in
// order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>

#include <torch/torch.h>

#include "kiln/data/dataset.hpp"
#include "kiln/errors.hpp"

namespace kiln::data {

// The generator a transform draws from: a standard UniformRandomBitGenerator (use it with any
// std:: distribution), made fresh for every sample. SplitMix64 (Steele et al. 2014): seeding is
// one word, where std::mt19937_64 spends ~2 us per sample filling its 312-word state.
class sample_rng {
 public:
  using result_type = std::uint64_t;
  explicit sample_rng(std::uint64_t seed) : state_(seed) {}
  // One generator per (seed, epoch, position, rank): each word is mixed in through a full round.
  sample_rng(std::uint64_t seed, std::uint64_t epoch, std::uint64_t position, std::uint64_t rank)
      : state_(mix(mix(mix(mix(seed) ^ epoch) ^ position) ^ rank)) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()() { return mix(state_ += 0x9e3779b97f4a7c15ull); }

 private:
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
};

template <class T>
concept transform = requires(const T& t, example& e, sample_rng& rng) { t(e, rng); };

// No per-sample work: the loader gathers whole batches instead (one index_select).
struct no_transform {
  void operator()(example&, sample_rng&) const {}
};

// Pads an image ([C, H, W] or [H, W]) with `padding` zeros on every side and takes a random crop
// of the original size: the image shifts by up to `padding` pixels in each direction.
struct random_crop {
  std::int64_t padding = 4;
  void operator()(example& e, sample_rng& rng) const {
    auto& x = e.input;
    if (x.dim() < 2) throw data_error("random_crop needs an image of 2 or more dimensions, got " + std::to_string(x.dim()));
    if (padding == 0) return;
    std::uniform_int_distribution<std::int64_t> shift(-padding, padding);
    const auto dy = shift(rng), dx = shift(rng);
    const auto h = x.size(-2), w = x.size(-1);
    const auto rows = h - std::abs(dy), cols = w - std::abs(dx);
    const auto to_y = std::max<std::int64_t>(0, -dy), to_x = std::max<std::int64_t>(0, -dx);
    const auto from_y = std::max<std::int64_t>(0, dy), from_x = std::max<std::int64_t>(0, dx);
    if (x.is_contiguous() && x.device().is_cpu()) {
      // Row by row with memcpy: the tensor-op version (zeros, two narrows, copy_) costs more in
      // dispatch than the copying on a 28 x 28 image.
      auto out = torch::zeros_like(x);
      if (rows > 0 && cols > 0) {
        const auto element = static_cast<std::int64_t>(x.element_size());
        const auto* in = static_cast<const char*>(x.data_ptr());
        auto* to = static_cast<char*>(out.data_ptr());
        for (std::int64_t plane = 0; plane < x.numel() / (h * w); ++plane)
          for (std::int64_t y = 0; y < rows; ++y)
            std::memcpy(to + ((plane * h + to_y + y) * w + to_x) * element,
                        in + ((plane * h + from_y + y) * w + from_x) * element, static_cast<std::size_t>(cols * element));
      }
      x = out;
      return;
    }
    auto out = torch::zeros_like(x);
    if (rows > 0 && cols > 0)
      out.narrow(-2, to_y, rows).narrow(-1, to_x, cols).copy_(x.narrow(-2, from_y, rows).narrow(-1, from_x, cols));
    x = out;
  }
};

// Mirrors an image left to right with the given probability.
struct horizontal_flip {
  double probability = 0.5;
  void operator()(example& e, sample_rng& rng) const {
    if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) >= probability) return;
    auto& x = e.input;
    if (!(x.is_contiguous() && x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.dim() >= 1)) {
      x = x.flip({-1});
      return;
    }
    // Each row reversed in a loop: flip() costs a dispatch and a TensorIterator setup per image.
    auto out = torch::empty_like(x);
    const auto w = x.size(-1);
    const float* in = x.data_ptr<float>();
    float* to = out.data_ptr<float>();
    for (std::int64_t row = 0; row < x.numel() / w; ++row)
      std::reverse_copy(in + row * w, in + (row + 1) * w, to + row * w);
    x = out;
  }
};

template <class... T>
struct composed {
  std::tuple<T...> steps;
  void operator()(example& e, sample_rng& rng) const {
    std::apply([&](const auto&... step) { (step(e, rng), ...); }, steps);
  }
};

template <transform... T>
composed<T...> compose(T... steps) {
  return {{std::move(steps)...}};
}

}  // namespace kiln::data
