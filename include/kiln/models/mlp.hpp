// kiln/models/mlp.hpp: a plain multi-layer perceptron.
//
// The smallest model kiln ships: the baseline for tabular or flattened-image data and the
// model the fast tests train, so a change in the training loop shows up in seconds.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/data/source.hpp"
#include "kiln/errors.hpp"
#include "kiln/models/dropout.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::models {

// Also the [model] kind "mlp" of a recipe (kiln/recipe/components.hpp).
struct mlp_settings {
  static constexpr std::string_view kind = "mlp";
  std::int64_t in_features = 784;
  std::vector<std::int64_t> hidden{256, 256};
  std::int64_t classes = 10;
  double dropout = 0.0;

  template <class V>
  void describe(V& v) {
    v.field("in_features", in_features, "input features per sample (inputs are flattened)",
            checks::positive);
    v.field("hidden", hidden, "width of each hidden layer; empty gives a linear model",
            checks::each_positive);
    v.field("classes", classes, "outputs: classes, or target values for regression", checks::positive);
    v.field("dropout", dropout, "dropout after each hidden activation; 0 disables it",
            checks::in_range_open(0.0, 1.0));
  }

  // The model for a recipe's data; throws config_error when it does not fit it.
  torch::nn::AnyModule build(const data_info& data) const;
};


class mlp_impl : public torch::nn::Module {
 public:
  explicit mlp_impl(const mlp_settings& settings)
      : settings_(kiln::checked(settings, "model")) {  // checked as a recipe's would be
    // One Sequential keeps parameter names flat and predictable ("layers.0.weight"),
    // which is what per-layer policies and saved states key on.
    std::int64_t width = settings_.in_features;
    for (std::int64_t next : settings_.hidden) {
      layers->push_back(torch::nn::Linear(width, next));
      layers->push_back(torch::nn::ReLU());
      if (settings_.dropout > 0.0) layers->push_back(kiln::models::dropout(settings_.dropout));
      width = next;
    }
    layers->push_back(torch::nn::Linear(width, settings_.classes));
    register_module("layers", layers);
  }

  // x: [B, in_features] or any [B, ...] whose trailing dims multiply to in_features.
  // Returns logits [B, classes].
  torch::Tensor forward(torch::Tensor x) {
    if (x.dim() < 1 || x.numel() != x.size(0) * settings_.in_features)
      throw config_error("mlp: model.in_features is " + std::to_string(settings_.in_features) +
                         " but the input has shape " + shape_text(x));
    return layers->forward(x.reshape({x.size(0), settings_.in_features}));
  }

  const mlp_settings& settings() const { return settings_; }

  torch::nn::Sequential layers;

 private:
  static std::string shape_text(const torch::Tensor& x) {
    std::string text = "[";
    for (std::int64_t i = 0; i < x.dim(); ++i) text += (i ? ", " : "") + std::to_string(x.size(i));
    return text + "]";
  }

  mlp_settings settings_;
};

TORCH_MODULE_IMPL(mlp, mlp_impl);

inline torch::nn::AnyModule mlp_settings::build(const data_info& data) const {
  if (data.tokens()) throw config_error("mlp classifies feature vectors; token data needs kind = \"gpt\"");
  if (in_features != data.features())
    throw config_error("model.in_features = " + std::to_string(in_features) + " but the data has " +
                       std::to_string(data.features()) + " features per sample (shape " + data.shape_text() +
                       "); set model.in_features = " + std::to_string(data.features()));
  if (classes != data.classes)
    throw config_error("model.classes = " + std::to_string(classes) + " but the data has " + std::to_string(data.classes) +
                       (data.targets == data::targets::values ? " target values per sample" : " classes") +
                       "; set model.classes = " + std::to_string(data.classes));
  return torch::nn::AnyModule(mlp(*this));
}

}  // namespace kiln::models
