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

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <string>
#include <vector>

namespace consumer {

// RMSprop (Tieleman & Hinton 2012), as torch.optim.RMSprop computes it without momentum:
//   v = alpha v + (1 - alpha) g^2;  p -= lr g / (sqrt(v) + eps)
// Started from kiln's default optimizer (kiln/optim/sgd.hpp), which lists the members.
class rmsprop {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "rmsprop";

  struct settings {
    double lr = 1e-2;
    double alpha = 0.99;
    double eps = 1e-8;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule)", kiln::checks::positive);
      v.field("alpha", alpha, "decay of the running mean of squared gradients", kiln::checks::in_range_open(0.0, 1.0));
      v.field("eps", eps, "added to the root mean square", kiln::checks::positive);
    }
  };

  explicit rmsprop(const settings& s) : settings_(s), lr_(s.lr) {}

  void attach(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
    for (const auto& [name, p] : named) params_.push_back({name, p, torch::zeros_like(p)});
  }
  void step() {
    torch::NoGradGuard no_grad;
    for (auto& [name, p, square_avg] : params_) {
      if (!p.grad().defined()) continue;
      const auto& g = p.grad();
      square_avg.mul_(settings_.alpha).addcmul_(g, g, 1.0 - settings_.alpha);
      p.addcdiv_(g, square_avg.sqrt().add_(settings_.eps), -lr_);
    }
  }
  void zero_grad() {
    for (auto& entry : params_)
      if (entry.param.grad().defined()) entry.param.grad().zero_();
  }
  void set_lr(double lr) { lr_ = lr; }
  double base_lr() const { return settings_.lr; }
  std::int64_t state_bytes() const {
    std::int64_t bytes = 0;
    for (const auto& entry : params_) bytes += entry.square_avg.numel() * entry.square_avg.element_size();
    return bytes;
  }
  // A resumed run continues from the same running means.
  void save_state(kiln::state_dict& state, const std::string& prefix) const {
    for (const auto& entry : params_) state[prefix + entry.name + "/square_avg"] = entry.square_avg.clone();
  }
  void load_state(const kiln::state_dict& state, const std::string& prefix) {
    for (auto& entry : params_) {
      const auto key = prefix + entry.name + "/square_avg";
      if (!state.count(key)) throw kiln::state_error("saved state has no entry \"" + key + "\"");
      entry.square_avg.copy_(state.at(key));
    }
  }

 private:
  struct entry {
    std::string name;
    torch::Tensor param, square_avg;
  };
  settings settings_;
  double lr_;
  std::vector<entry> params_;
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
TORCH_MODULE(residual_mlp);

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
