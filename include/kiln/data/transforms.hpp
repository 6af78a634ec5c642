// kiln/data/transforms.hpp: per-sample transforms the loader's workers apply before collating.
//
// A transform is a callable `void(example&, std::mt19937_64& rng)`. The loader seeds `rng` from
// (seed, epoch, the sample's position in the epoch), so a sample's augmentation does not depend
// on which worker made it or on how many workers there are. compose(a, b, ...) applies in order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <tuple>
#include <utility>

#include <torch/torch.h>

#include "kiln/data/dataset.hpp"
#include "kiln/errors.hpp"

namespace kiln::data {

template <class T>
concept transform = requires(const T& t, example& e, std::mt19937_64& rng) { t(e, rng); };

// No per-sample work: the loader gathers whole batches instead (one index_select).
struct no_transform {
  void operator()(example&, std::mt19937_64&) const {}
};

// Pads an image ([C, H, W] or [H, W]) with `padding` zeros on every side and takes a random crop
// of the original size: the image shifts by up to `padding` pixels in each direction.
struct random_crop {
  std::int64_t padding = 4;
  void operator()(example& e, std::mt19937_64& rng) const {
    auto& x = e.input;
    if (x.dim() < 2) throw data_error("random_crop needs an image of 2 or more dimensions, got " + std::to_string(x.dim()));
    std::uniform_int_distribution<std::int64_t> shift(-padding, padding);
    const auto dy = shift(rng), dx = shift(rng);
    const auto h = x.size(-2), w = x.size(-1);
    auto out = torch::zeros_like(x);
    const auto rows = h - std::abs(dy), cols = w - std::abs(dx);
    if (rows > 0 && cols > 0)
      out.narrow(-2, std::max<std::int64_t>(0, -dy), rows)
          .narrow(-1, std::max<std::int64_t>(0, -dx), cols)
          .copy_(x.narrow(-2, std::max<std::int64_t>(0, dy), rows).narrow(-1, std::max<std::int64_t>(0, dx), cols));
    x = out;
  }
};

// Mirrors an image left to right with the given probability.
struct horizontal_flip {
  double probability = 0.5;
  void operator()(example& e, std::mt19937_64& rng) const {
    if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) < probability) e.input = e.input.flip({-1});
  }
};

template <class... T>
struct composed {
  std::tuple<T...> steps;
  void operator()(example& e, std::mt19937_64& rng) const {
    std::apply([&](const auto&... step) { (step(e, rng), ...); }, steps);
  }
};

template <transform... T>
composed<T...> compose(T... steps) {
  return {{std::move(steps)...}};
}

}  // namespace kiln::data
