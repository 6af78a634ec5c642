// kiln/data/source.hpp: what a recipe's [data] kind loads, and what its [model] kind learns
// of it.
//
// A dataset kind (kiln/recipe/components.hpp) is a settings struct with a `load` that returns
// kiln::data::loaded: a training and an evaluation set in memory, and what their targets are.
// The model kind then sees a kiln::data_info, to check that it fits the data (an MLP's
// in_features against the features per sample, a GPT's vocabulary against the tokens) before
// any step runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/data/tensor_pair.hpp"

namespace kiln {

// What a dataset kind's load() is given by the run.
struct data_request {
  std::uint64_t seed = 0;  // [train] seed: generated data and held-out splits follow it
};

namespace data {

// What a dataset's targets are, which decides the loss a recipe trains with by default.
enum class targets {
  classes,  // class indices [N]: cross-entropy
  tokens,   // inputs are token ids, targets the next tokens [N, T]: next-token cross-entropy
  values,   // float values [N, V]: regression (mean squared error)
};

struct loaded {
  tensor_pair train, eval;
  std::int64_t classes = 0;  // classes; for tokens the vocabulary size; for values the values per sample
  data::targets targets = data::targets::classes;
};

}  // namespace data

// What a model kind learns of the data it will train on.
struct data_info {
  std::string kind;                         // the [data] kind, for messages
  std::vector<std::int64_t> sample_shape;   // one input sample (for tokens: {sequence length})
  std::int64_t classes = 0;                 // as in data::loaded
  data::targets targets = data::targets::classes;

  bool tokens() const { return targets == data::targets::tokens; }

  std::int64_t features() const {
    std::int64_t n = 1;
    for (auto d : sample_shape) n *= d;
    return n;
  }
  std::string shape_text() const {
    std::string text = "[";
    for (std::size_t i = 0; i < sample_shape.size(); ++i) text += (i ? ", " : "") + std::to_string(sample_shape[i]);
    return text + "]";
  }

  static data_info of(std::string kind, const data::loaded& d) {
    const auto sizes = d.train.inputs.sizes();
    return {std::move(kind), std::vector<std::int64_t>(sizes.begin() + 1, sizes.end()), d.classes, d.targets};
  }
};

}  // namespace kiln
