// kiln/data/synthetic.hpp: small generated datasets for tests and benchmarks.
//
// Both generators draw from a fixed "teacher" (a random network, a random Markov chain) that
// depends only on the shape arguments, and use `seed` only to draw samples from it: different
// seeds give fresh samples of the same task, so seed 1 for train and seed 2 for validation
// is a valid split. They use a private std::mt19937_64 with hand-written distributions, so the
// global torch RNG is left alone and the data is the same with any LibTorch or standard library.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/data/source.hpp"
#include "kiln/data/tensor_pair.hpp"
#include "kiln/errors.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::detail {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class synthetic_rng {
 public:
  explicit synthetic_rng(std::uint64_t seed) : engine_(splitmix64(seed)) {}

  // (0, 1]: never 0, so log() below stays finite.
  double uniform() { return (static_cast<double>(engine_() >> 11) + 1.0) * 0x1.0p-53; }

  std::int64_t below(std::int64_t n) {
    return static_cast<std::int64_t>(engine_() % static_cast<std::uint64_t>(n));
  }

  // Box-Muller, one value per call; the pair's sine half is cached.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = 6.283185307179586 * uniform();
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

inline void require_positive(const char* function, const char* name, std::int64_t value,
                             std::int64_t at_least = 1) {
  if (value < at_least)
    throw config_error(std::string(function) + ": " + name + " must be >= " +
                       std::to_string(at_least) + ", got " + std::to_string(value));
}

// Teacher seeds mix in a tag per generator so the two never share a stream.
inline constexpr std::uint64_t classification_teacher_tag = 0x6b696c6e2d636c73ull;
inline constexpr std::uint64_t markov_teacher_tag = 0x6b696c6e2d6d6b76ull;
inline constexpr std::uint64_t padding_tag = 0x6b696c6e2d706164ull;
inline constexpr std::uint64_t regression_teacher_tag = 0x6b696c6e2d726567ull;

}  // namespace kiln::detail

namespace kiln::data {

// inputs: float32 [n, features] ~ N(0, 1); targets: int64 [n] in [0, classes).
// Labels are argmax(tanh(x W1 + b1) W2 - c) for a random teacher with 32 hidden units; c
// centres the teacher's logits on a reference sample so the classes come out roughly balanced.
inline tensor_pair make_classification(std::int64_t n, std::int64_t features, std::int64_t classes,
                                       std::uint64_t seed) {
  detail::require_positive("make_classification", "n", n);
  detail::require_positive("make_classification", "features", features);
  detail::require_positive("make_classification", "classes", classes, 2);
  constexpr std::int64_t hidden = 32;

  detail::synthetic_rng teacher_rng(detail::classification_teacher_tag ^
                                    detail::splitmix64(static_cast<std::uint64_t>(features)) ^
                                    (static_cast<std::uint64_t>(classes) << 32));
  std::vector<double> w1(features * hidden), b1(hidden), w2(hidden * classes),
      centre(classes, 0.0);
  const double w1_scale = 1.0 / std::sqrt(static_cast<double>(features));
  const double w2_scale = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (auto& w : w1) w = teacher_rng.normal() * w1_scale;
  for (auto& b : b1) b = teacher_rng.normal() * 0.5;
  for (auto& w : w2) w = teacher_rng.normal() * w2_scale;

  std::vector<double> h(hidden);
  auto teacher_logits = [&](const auto& x, std::vector<double>& logits) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      double sum = b1[j];
      for (std::int64_t i = 0; i < features; ++i) sum += static_cast<double>(x[i]) * w1[i * hidden + j];
      h[j] = std::tanh(sum);
    }
    for (std::int64_t c = 0; c < classes; ++c) {
      double sum = -centre[c];
      for (std::int64_t j = 0; j < hidden; ++j) sum += h[j] * w2[j * classes + c];
      logits[c] = sum;
    }
  };

  std::vector<double> logits(classes), x_ref(features);
  constexpr int reference_samples = 2048;
  std::vector<double> mean(classes, 0.0);
  for (int r = 0; r < reference_samples; ++r) {
    for (auto& v : x_ref) v = teacher_rng.normal();
    teacher_logits(x_ref, logits);
    for (std::int64_t c = 0; c < classes; ++c) mean[c] += logits[c] / reference_samples;
  }
  centre = mean;

  tensor_pair pair;
  pair.inputs = torch::empty({n, features}, torch::kFloat);
  pair.targets = torch::empty({n}, torch::kLong);
  float* inputs = pair.inputs.data_ptr<float>();
  std::int64_t* targets = pair.targets.data_ptr<std::int64_t>();
  detail::synthetic_rng rng(seed);
  for (std::int64_t row = 0; row < n; ++row) {
    float* x = inputs + row * features;
    for (std::int64_t i = 0; i < features; ++i) x[i] = static_cast<float>(rng.normal());
    teacher_logits(x, logits);
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < classes; ++c)
      if (logits[c] > logits[best]) best = c;
    targets[row] = best;
  }
  return pair;
}

// inputs, targets: int64 [n, seq_len], targets shifted one step left of inputs (next-token
// prediction). Each token has three likely successors (probabilities 0.6, 0.25, 0.1) and
// otherwise, with probability 0.05, any token; a model that learns the chain gets the
// per-token loss down to about 1.3 nats for vocab 256, against log(256) = 5.5 for guessing.
//
// min_len < seq_len makes variable-length examples padded to seq_len, as fine-tuning data is:
// each sequence's length is drawn uniformly from [min_len, seq_len], and past it the inputs are
// 0 and the targets -100, the ignore index the loss skips. The tokens before that point are
// those of the unpadded draw.
inline tensor_pair make_token_sequences(std::int64_t n, std::int64_t seq_len, std::int64_t vocab,
                                        std::uint64_t seed, std::int64_t min_len = 0) {
  detail::require_positive("make_token_sequences", "n", n);
  detail::require_positive("make_token_sequences", "seq_len", seq_len);
  detail::require_positive("make_token_sequences", "vocab", vocab, 2);
  if (min_len == 0) min_len = seq_len;
  if (min_len < 1 || min_len > seq_len)
    throw config_error("make_token_sequences: min_len must be from 1 to seq_len (" + std::to_string(seq_len) +
                       "), got " + std::to_string(min_len));
  constexpr int fanout = 3;
  constexpr double cumulative[fanout] = {0.6, 0.85, 0.95};

  detail::synthetic_rng teacher_rng(detail::markov_teacher_tag ^
                                    detail::splitmix64(static_cast<std::uint64_t>(vocab)));
  std::vector<std::int64_t> successors(vocab * fanout);
  for (std::int64_t token = 0; token < vocab; ++token) {
    std::int64_t* next = &successors[token * fanout];
    for (int k = 0; k < fanout; ++k) {
      // Distinct successors where the vocabulary allows it, so each keeps its probability.
      do next[k] = teacher_rng.below(vocab);
      while (k < vocab && std::find(next, next + k, next[k]) != next + k);
    }
  }

  auto sequences = torch::empty({n, seq_len + 1}, torch::kLong);
  std::int64_t* out = sequences.data_ptr<std::int64_t>();
  detail::synthetic_rng rng(seed);
  for (std::int64_t row = 0; row < n; ++row) {
    std::int64_t* seq = out + row * (seq_len + 1);
    seq[0] = rng.below(vocab);
    for (std::int64_t t = 1; t <= seq_len; ++t) {
      const double u = rng.uniform();
      int k = 0;
      while (k < fanout && u > cumulative[k]) ++k;
      seq[t] = k < fanout ? successors[seq[t - 1] * fanout + k] : rng.below(vocab);
    }
  }

  tensor_pair pair;
  pair.inputs = sequences.slice(1, 0, seq_len).contiguous();
  pair.targets = sequences.slice(1, 1, seq_len + 1).contiguous();
  if (min_len < seq_len) {
    detail::synthetic_rng length_rng(seed ^ detail::padding_tag);
    std::int64_t* inputs = pair.inputs.data_ptr<std::int64_t>();
    std::int64_t* targets = pair.targets.data_ptr<std::int64_t>();
    for (std::int64_t row = 0; row < n; ++row) {
      const std::int64_t length = min_len + length_rng.below(seq_len - min_len + 1);
      std::fill(inputs + row * seq_len + length, inputs + (row + 1) * seq_len, std::int64_t{0});
      std::fill(targets + row * seq_len + length, targets + (row + 1) * seq_len, std::int64_t{-100});
    }
  }
  return pair;
}

// inputs: float32 [n, features] ~ N(0, 1); targets: float32 [n, outputs] = tanh(x W1 + b1) W2
// + noise N(0, noise^2), for a random teacher with 32 hidden units. The teacher's targets have
// unit variance per output about, so a model's mean squared error reads against 1 (predicting
// the mean) and noise^2 (the best any model can do).
inline tensor_pair make_regression(std::int64_t n, std::int64_t features, std::int64_t outputs, double noise,
                                   std::uint64_t seed) {
  detail::require_positive("make_regression", "n", n);
  detail::require_positive("make_regression", "features", features);
  detail::require_positive("make_regression", "outputs", outputs);
  constexpr std::int64_t hidden = 32;
  detail::synthetic_rng teacher_rng(detail::regression_teacher_tag ^
                                    detail::splitmix64(static_cast<std::uint64_t>(features)) ^
                                    (static_cast<std::uint64_t>(outputs) << 32));
  std::vector<double> w1(features * hidden), b1(hidden), w2(hidden * outputs);
  for (auto& w : w1) w = teacher_rng.normal() / std::sqrt(static_cast<double>(features));
  for (auto& b : b1) b = teacher_rng.normal() * 0.5;
  // tanh of a unit-variance pre-activation has a variance of about 0.39: scale W2 for unit-variance targets.
  for (auto& w : w2) w = teacher_rng.normal() / std::sqrt(0.39 * static_cast<double>(hidden));

  detail::synthetic_rng rng(seed);
  tensor_pair pair{torch::empty({n, features}, torch::kFloat32), torch::empty({n, outputs}, torch::kFloat32)};
  auto x = pair.inputs.accessor<float, 2>();
  auto y = pair.targets.accessor<float, 2>();
  std::vector<double> h(hidden);
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t i = 0; i < features; ++i) x[r][i] = static_cast<float>(rng.normal());
    for (std::int64_t j = 0; j < hidden; ++j) {
      double sum = b1[j];
      for (std::int64_t i = 0; i < features; ++i) sum += static_cast<double>(x[r][i]) * w1[i * hidden + j];
      h[j] = std::tanh(sum);
    }
    for (std::int64_t o = 0; o < outputs; ++o) {
      double sum = 0;
      for (std::int64_t j = 0; j < hidden; ++j) sum += h[j] * w2[j * outputs + o];
      y[r][o] = static_cast<float>(sum + noise * rng.normal());
    }
  }
  return pair;
}

// One draw of train + evaluation samples (so both come from the same teacher), split after the
// first `train` rows: what each synthetic [data] kind loads.
inline loaded split_draw(const tensor_pair& all, std::int64_t train, std::int64_t classes, data::targets targets) {
  return {{all.inputs.slice(0, 0, train), all.targets.slice(0, 0, train)},
          {all.inputs.slice(0, train), all.targets.slice(0, train)},
          classes,
          targets};
}

// The [data] kind "synthetic-classification" of a recipe (kiln/recipe/components.hpp).
struct synthetic_classification_settings {
  static constexpr std::string_view kind = "synthetic-classification";
  std::int64_t samples = 4096;
  std::int64_t eval_samples = 1024;
  std::int64_t features = 32;
  std::int64_t classes = 4;

  template <class V>
  void describe(V& v) {
    v.field("samples", samples, "training samples to generate", checks::positive);
    v.field("eval_samples", eval_samples, "evaluation samples to generate", checks::positive);
    v.field("features", features, "input features per sample", checks::positive);
    v.field("classes", classes, "number of classes", checks::positive);
  }
  loaded load(const data_request& request) const {
    return split_draw(make_classification(samples + eval_samples, features, classes, request.seed), samples, classes,
                      targets::classes);
  }
};

// The [data] kind "synthetic-tokens" of a recipe: next-token prediction on a Markov chain.
struct synthetic_tokens_settings {
  static constexpr std::string_view kind = "synthetic-tokens";
  std::int64_t samples = 4096;
  std::int64_t eval_samples = 1024;
  std::int64_t seq_len = 64;
  std::int64_t vocab_size = 64;
  std::int64_t min_len = 0;

  template <class V>
  void describe(V& v) {
    v.field("samples", samples, "training samples to generate", checks::positive);
    v.field("eval_samples", eval_samples, "evaluation samples to generate", checks::positive);
    v.field("seq_len", seq_len, "tokens per sequence", checks::positive);
    v.field("vocab_size", vocab_size, "distinct tokens", checks::positive);
    v.field("min_len", min_len,
            "variable-length sequences: each is from min_len to seq_len tokens long, padded to seq_len with "
            "targets the loss ignores (0: all seq_len long)",
            checks::non_negative);
  }
  loaded load(const data_request& request) const {
    if (min_len > seq_len)
      throw config_error("data.min_len = " + std::to_string(min_len) + " is longer than data.seq_len = " +
                         std::to_string(seq_len));
    return split_draw(make_token_sequences(samples + eval_samples, seq_len, vocab_size, request.seed, min_len),
                      samples, vocab_size, targets::tokens);
  }
};


// The [data] kind "synthetic-regression" of a recipe: float targets for the mse or l1 loss.
struct synthetic_regression_settings {
  static constexpr std::string_view kind = "synthetic-regression";
  std::int64_t samples = 4096;
  std::int64_t eval_samples = 1024;
  std::int64_t features = 16;
  std::int64_t outputs = 1;
  double noise = 0.1;

  template <class V>
  void describe(V& v) {
    v.field("samples", samples, "training samples to generate", checks::positive);
    v.field("eval_samples", eval_samples, "evaluation samples to generate", checks::positive);
    v.field("features", features, "input features per sample", checks::positive);
    v.field("outputs", outputs, "target values per sample", checks::positive);
    v.field("noise", noise, "standard deviation of the noise on each target (the best mse is noise^2)",
            checks::non_negative);
  }
  loaded load(const data_request& request) const {
    return split_draw(make_regression(samples + eval_samples, features, outputs, noise, request.seed), samples,
                      outputs, targets::values);
  }
};
}  // namespace kiln::data
