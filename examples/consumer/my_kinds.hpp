// A project's own kinds, named in its recipe (consumer.toml) like kiln's own:
//
//   [optimizer] kind = "rmsprop"        consumer::rmsprop, a policy on the optimizer axis
//   [model]     kind = "residual-mlp"   consumer::residual_mlp_settings, a model kind
//   [data]      kind = "spirals"        consumer::spirals, a dataset kind
//   [loss]      kind = "label-smoothing" consumer::label_smoothing, a loss
//
// CMakeLists.txt passes this header to kiln_add_recipe_executable(... REGISTER my_kinds.hpp);
// the KILN_REGISTER_* lines at the end put each type in the registry under its own `kind`.
#pragma once

#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/recipe/registry.hpp>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <string>
#include <vector>

namespace consumer {

// RMSprop (Tieleman & Hinton 2012), as torch.optim.RMSprop computes it without momentum:
//   d = g + wd p;  v = alpha v + (1 - alpha) d^2;  p -= lr d / (sqrt(v) + eps)
// Copied from kiln's default optimizer (kiln/optim/sgd.hpp) and given RMSprop's rule: the
// public base kiln::optim::fused_optimizer keeps the parameters and their state (saved and
// resumed by parameter name) and runs the rule as one vectorised pass per parameter.
class rmsprop : public kiln::optim::fused_optimizer<rmsprop> {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "rmsprop";

  struct settings {
    double lr = 1e-2;
    double alpha = 0.99;
    double eps = 1e-8;
    double weight_decay = 0.0;
    std::vector<std::string> no_decay;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule)", kiln::checks::positive);
      v.field("alpha", alpha, "decay of the running mean of squared gradients", kiln::checks::in_range_open(0.0, 1.0));
      v.field("eps", eps, "added to the root mean square", kiln::checks::positive);
      v.field("weight_decay", weight_decay, "L2 penalty added to the gradient", kiln::checks::non_negative);
      v.field("no_decay", no_decay, kiln::optim::no_decay_help);
    }
  };

  explicit rmsprop(const settings& s) : fused_optimizer(s.lr, s.weight_decay, s.no_decay), settings_(s) {}

  double base_lr() const { return settings_.lr; }

  void init_state(kiln::optim::slot& s) const {
    s.state = {{"square_avg", torch::zeros(s.param.sizes(), s.param.options().dtype(torch::kFloat32))}};
  }

  void update(kiln::optim::slot& s, const torch::Tensor& grad) const {
    const float alpha = static_cast<float>(settings_.alpha), rest = static_cast<float>(1.0 - settings_.alpha);
    const float eps = static_cast<float>(settings_.eps), step = static_cast<float>(lr());
    const float wd = static_cast<float>(s.weight_decay);
    apply_rule(
        [=](auto& p, const auto& g, auto& square_avg) {
          const auto d = g + wd * p;
          square_avg = square_avg * alpha + d * d * rest;
          p = p - step * d / (kiln::optim::vsqrt(square_avg) + eps);
        },
        s, grad, s.field(0));
  }

 private:
  settings settings_;
};

// A model of residual blocks, x + W2 relu(W1 x), between an input and an output projection.
struct residual_mlp_impl : torch::nn::Module {
  residual_mlp_impl(std::int64_t in, std::int64_t width, std::int64_t blocks, std::int64_t classes)
      : input(register_module("input", torch::nn::Linear(in, width))),
        output(register_module("output", torch::nn::Linear(width, classes))) {
    for (std::int64_t i = 0; i < blocks; ++i) {
      hidden.push_back(register_module("block" + std::to_string(i) + "_in", torch::nn::Linear(width, width)));
      hidden.push_back(register_module("block" + std::to_string(i) + "_out", torch::nn::Linear(width, width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(input->forward(x.flatten(1)));
    for (std::size_t i = 0; i < hidden.size(); i += 2) x = x + hidden[i + 1]->forward(torch::relu(hidden[i]->forward(x)));
    return output->forward(x);
  }
  torch::nn::Linear input, output;
  std::vector<torch::nn::Linear> hidden;
};
TORCH_MODULE_IMPL(residual_mlp, residual_mlp_impl);

// [model] kind = "residual-mlp": its keys, and the model for the recipe's data.
struct residual_mlp_settings {
  static constexpr std::string_view kind = "residual-mlp";
  std::int64_t width = 64;
  std::int64_t blocks = 2;
  template <class V>
  void describe(V& v) {
    v.field("width", width, "units of every hidden layer", kiln::checks::positive);
    v.field("blocks", blocks, "residual blocks", kiln::checks::non_negative);
  }
  // Input and output sizes come from the data, so the recipe does not repeat them.
  torch::nn::AnyModule build(const kiln::data_info& data) const {
    if (data.tokens()) throw kiln::config_error("residual-mlp classifies feature vectors, not token sequences");
    return torch::nn::AnyModule(residual_mlp(data.features(), width, blocks, data.classes));
  }
};

// [data] kind = "spirals": points on interleaved spiral arms in the plane, one class per arm.
struct spirals {
  static constexpr std::string_view kind = "spirals";
  std::int64_t samples = 2048;
  std::int64_t eval_samples = 512;
  std::int64_t arms = 3;
  double noise = 0.05;
  template <class V>
  void describe(V& v) {
    v.field("samples", samples, "training points", kiln::checks::positive);
    v.field("eval_samples", eval_samples, "evaluation points", kiln::checks::positive);
    v.field("arms", arms, "spiral arms, one class each", kiln::checks::positive);
    v.field("noise", noise, "standard deviation of the noise added to each coordinate", kiln::checks::non_negative);
  }
  kiln::data::loaded load(const kiln::data_request& request) const {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(request.seed);
    const std::int64_t n = samples + eval_samples;
    auto labels = torch::randint(arms, {n}, generator, torch::kInt64);
    auto radius = torch::rand({n}, generator);
    auto angle = radius * 3.0 * M_PI + labels.to(torch::kFloat32) * (2.0 * M_PI / static_cast<double>(arms));
    auto points = torch::stack({radius * torch::cos(angle), radius * torch::sin(angle)}, 1);
    points = points + noise * torch::randn({n, 2}, generator);
    return {{points.slice(0, 0, samples), labels.slice(0, 0, samples)},
            {points.slice(0, samples), labels.slice(0, samples)},
            arms,
            kiln::data::targets::classes};
  }
};

// [loss] kind = "label-smoothing": cross-entropy against targets that keep `smoothing` of their
// mass spread over all classes (Szegedy et al. 2016), with accuracy reported by evaluation.
struct label_smoothing {
  static constexpr std::string_view kind = "label-smoothing";
  double smoothing = 0.1;
  template <class V>
  void describe(V& v) {
    v.field("smoothing", smoothing, "share of each target's probability spread over all classes",
            kiln::checks::in_range_open(0.0, 1.0));
  }
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
    namespace F = torch::nn::functional;
    return F::cross_entropy(logits.to(torch::kFloat32), targets, F::CrossEntropyFuncOptions().label_smoothing(smoothing));
  }
  std::vector<kiln::metric> metrics() const {
    return {{"accuracy",
             [](const torch::Tensor& logits, const torch::Tensor& targets) { return logits.argmax(-1).eq(targets).sum(); },
             [](double mean, double) { return mean; }, true}};
  }
};

}  // namespace consumer

KILN_REGISTER_POLICY(consumer::rmsprop)
KILN_REGISTER_MODEL(consumer::residual_mlp_settings)
KILN_REGISTER_DATASET(consumer::spirals)
KILN_REGISTER_LOSS(consumer::label_smoothing)
