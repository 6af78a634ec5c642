// Tests for kiln/diagnostics: module attribution of non-finite forward outputs and gradients,
// anomaly mode, per-module gradient norms and update ratios against hand computations,
// warnings, and that an inactive step installs nothing.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/diagnostics.hpp>
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

// Linear layers are layers.0, layers.2 and layers.4: ReLUs sit at 1 and 3.
kiln::models::mlp small_mlp() {
  torch::manual_seed(0);
  return kiln::models::mlp(kiln::models::mlp_settings{.in_features = 8, .hidden = {16, 16}, .classes = 3});
}

struct batch {
  torch::Tensor x, y;
};

batch small_batch() {
  torch::manual_seed(1);
  return {torch::randn({5, 8}), torch::randint(0, 3, {5}, torch::kLong)};
}

torch::Tensor loss_of(kiln::models::mlp& model, const batch& b) {
  return torch::nn::functional::cross_entropy(model->forward(b.x), b.y);
}

torch::Tensor parameter(kiln::models::mlp& model, const std::string& name) {
  return model->named_parameters()[name];
}

const kiln::layer_health* layer(const kiln::diagnostics& diag, const std::string& module) {
  for (const auto& l : diag.last_report())
    if (l.module == module) return &l;
  return nullptr;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
  for (const auto& line : lines)
    if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("diagnostics: a NaN planted in layers.2.weight is reported as a forward output of layers.2") {
  auto model = small_mlp();
  auto b = small_batch();
  {
    torch::NoGradGuard no_grad;
    parameter(model, "layers.2.weight")[3][5] = std::numeric_limits<float>::quiet_NaN();
  }
  kiln::diagnostics diag({.every = 1});
  diag.attach(*model);
  {
    auto watch = diag.watch_forward(1);
    CHECK(watch.active());
    auto loss = loss_of(model, b);
  }
  REQUIRE(diag.first_non_finite().has_value());
  const auto& r = *diag.first_non_finite();
  MESSAGE("reported: " << r.text());
  CHECK(r.module == "layers.2");
  CHECK(r.where == "forward output");
  CHECK(r.step == 1);
  CHECK_FALSE(r.op.empty());
  CHECK(r.text().find("layers.2") != std::string::npos);
}

TEST_CASE("diagnostics: anomaly mode throws at the end of the forward, naming the module") {
  auto model = small_mlp();
  auto b = small_batch();
  {
    torch::NoGradGuard no_grad;
    parameter(model, "layers.2.weight")[0][0] = std::numeric_limits<float>::infinity();
  }
  kiln::diagnostics diag({.anomaly = true});
  diag.attach(*model);
  std::string message;
  try {
    auto watch = diag.watch_forward(7);
    auto loss = loss_of(model, b);
  } catch (const kiln::anomaly_error& e) {
    message = e.what();
  }
  MESSAGE("anomaly_error: " << message);
  CHECK(message.find("layers.2") != std::string::npos);
  CHECK(message.find("step 7") != std::string::npos);

  // close() throws at a chosen point, and an exception already in flight is not replaced.
  kiln::diagnostics again({.anomaly = true});
  again.attach(*model);
  auto watch = again.watch_forward(1);
  auto loss = loss_of(model, b);
  CHECK_THROWS_AS(watch.close(), kiln::anomaly_error);
  CHECK_NOTHROW(watch.close());
  CHECK_THROWS_AS(([&] {
                    auto w = again.watch_forward(2);
                    loss_of(model, b);
                    throw std::logic_error("first");
                  }()),
                  std::logic_error);
}

TEST_CASE("diagnostics: a NaN born in the backward is reported as a gradient of layers.2.weight") {
  // A proximal penalty ||w - w_anchor|| written as sqrt(sum((w - anchor)^2)), evaluated where
  // w == anchor (the first step after taking the anchor): the forward adds an exact 0, but
  // d sqrt(u)/du = 1/(2 sqrt(0)) = inf, multiplied by d u/dw = 2 (w - anchor) = 0, gives NaN.
  // Everything else in the model has finite gradients.
  auto model = small_mlp();
  auto b = small_batch();
  auto w = parameter(model, "layers.2.weight");
  auto anchor = w.detach().clone();
  kiln::diagnostics diag({.every = 1});
  diag.attach(*model);
  torch::Tensor loss;
  {
    auto watch = diag.watch_forward(3);
    loss = loss_of(model, b) + torch::sqrt((w - anchor).pow(2).sum());
  }
  CHECK(std::isfinite(loss.item<double>()));
  CHECK_FALSE(diag.first_non_finite().has_value());
  loss.backward();
  diag.after_backward(3);
  REQUIRE(diag.first_non_finite().has_value());
  const auto& r = *diag.first_non_finite();
  MESSAGE("reported: " << r.text());
  CHECK(r.where == "gradient");
  CHECK(r.module == "layers.2");
  CHECK(r.parameter == "layers.2.weight");
  CHECK(r.step == 3);
  REQUIRE(layer(diag, "layers.2") != nullptr);
  CHECK_FALSE(layer(diag, "layers.2")->finite);
  CHECK(layer(diag, "layers.4")->finite);
  CHECK(any_contains(diag.warnings(), "layers.2", "non-finite"));

  kiln::diagnostics strict({.anomaly = true});
  strict.attach(*model);
  try {
    strict.after_backward(4);
    FAIL("expected anomaly_error");
  } catch (const kiln::anomaly_error& e) {
    CHECK(std::string(e.what()).find("layers.2.weight") != std::string::npos);
  }
}

TEST_CASE("diagnostics: per-module gradient norms and update ratios match hand computations") {
  auto model = small_mlp();
  auto b = small_batch();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5));
  kiln::diagnostics diag({.every = 2});
  diag.attach(*model);
  CHECK_FALSE(diag.due(1));
  CHECK(diag.due(2));

  const std::int64_t step = 2;
  optimizer.zero_grad();
  {
    auto watch = diag.watch_forward(step);
    loss_of(model, b).backward();
  }
  diag.after_backward(step);

  std::vector<std::string> modules{"layers.0", "layers.2", "layers.4"};
  REQUIRE(diag.last_report().size() == 3);
  std::vector<torch::Tensor> before;
  for (std::size_t m = 0; m < modules.size(); ++m) {
    CHECK(diag.last_report()[m].module == modules[m]);
    auto gw = parameter(model, modules[m] + ".weight").grad();
    auto gb = parameter(model, modules[m] + ".bias").grad();
    const double expected = std::sqrt(gw.pow(2).sum().item<double>() + gb.pow(2).sum().item<double>());
    CHECK(diag.last_report()[m].grad_norm == doctest::Approx(expected).epsilon(1e-6));
    CHECK(diag.last_report()[m].update_ratio == -1.0);
    CHECK(diag.last_report()[m].finite);
    before.push_back(parameter(model, modules[m] + ".weight").detach().clone());
    before.push_back(parameter(model, modules[m] + ".bias").detach().clone());
  }
  optimizer.step();
  diag.after_step(step);
  for (std::size_t m = 0; m < modules.size(); ++m) {
    auto w = parameter(model, modules[m] + ".weight").detach();
    auto bias = parameter(model, modules[m] + ".bias").detach();
    const double delta = (w - before[2 * m]).pow(2).sum().item<double>() + (bias - before[2 * m + 1]).pow(2).sum().item<double>();
    const double norm = before[2 * m].pow(2).sum().item<double>() + before[2 * m + 1].pow(2).sum().item<double>();
    const double expected = std::sqrt(delta) / std::sqrt(norm);
    CHECK(diag.last_report()[m].param_norm == doctest::Approx(std::sqrt(norm)).epsilon(1e-6));
    CHECK(diag.last_report()[m].update_ratio == doctest::Approx(expected).epsilon(1e-6));
    CHECK(expected > 0.0);
  }
  CHECK(diag.warnings().empty());
}

TEST_CASE("diagnostics: a scaled-up loss gives an exploding warning that names the module") {
  auto model = small_mlp();
  auto b = small_batch();
  kiln::diagnostics diag({.every = 1, .explode_threshold = 1e3});
  diag.attach(*model);
  (loss_of(model, b) * 1e6).backward();
  diag.after_backward(1);
  const auto warnings = diag.warnings();
  for (const auto& w : warnings) MESSAGE(w);
  REQUIRE_FALSE(warnings.empty());
  CHECK(any_contains(warnings, "layers.4", "exploding"));
  CHECK(layer(diag, "layers.4")->grad_norm > 1e3);
}

TEST_CASE("diagnostics: a gradient that does not reach a layer gives a vanishing warning") {
  auto model = small_mlp();
  auto b = small_batch();
  kiln::diagnostics diag({.every = 1});
  diag.attach(*model);
  // Only the output bias gets a gradient: every weight and the hidden biases get exact zeros.
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  parameter(model, "layers.4.bias").mutable_grad() = torch::ones({3});
  diag.after_backward(1);
  const auto warnings = diag.warnings();
  CHECK(any_contains(warnings, "layers.0", "vanishing"));
  CHECK(any_contains(warnings, "layers.2", "vanishing"));
  CHECK_FALSE(any_contains(warnings, "layers.4", "vanishing"));
}

TEST_CASE("diagnostics: a step that is not due installs nothing") {
  auto model = small_mlp();
  auto b = small_batch();
  kiln::diagnostics diag({.every = 10});
  diag.attach(*model);
  int activations = 0, gradients = 0;
  diag.add_activation_hook([&](const std::string&, const std::string&, const torch::Tensor&) { ++activations; });
  diag.add_gradient_hook([&](const std::string&, const torch::Tensor&) { ++gradients; });
  {
    CHECK_FALSE(at::hasThreadLocalCallbacks());
    auto watch = diag.watch_forward(3);
    CHECK_FALSE(watch.active());
    CHECK_FALSE(at::hasThreadLocalCallbacks());
    loss_of(model, b).backward();
  }
  diag.after_backward(3);
  diag.after_step(3);
  CHECK(activations == 0);
  CHECK(gradients == 0);
  CHECK(diag.last_report().empty());

  {
    auto watch = diag.watch_forward(10);
    CHECK(at::hasThreadLocalCallbacks());
    loss_of(model, b);
  }
  CHECK_FALSE(at::hasThreadLocalCallbacks());
  CHECK(activations > 0);
}

TEST_CASE("diagnostics: the activation hook sees the modules in forward order") {
  auto model = small_mlp();
  auto b = small_batch();
  kiln::diagnostics diag({.every = 1});
  diag.attach(*model);
  std::vector<std::string> order;
  std::vector<std::string> seen;
  diag.add_activation_hook([&](const std::string& module, const std::string& op, const torch::Tensor& output) {
    seen.push_back(module + " " + op);
    if (!module.empty() && (order.empty() || order.back() != module)) order.push_back(module);
    CHECK(output.defined());
  });
  std::vector<std::string> grads;
  diag.add_gradient_hook([&](const std::string& parameter, const torch::Tensor& grad) {
    grads.push_back(parameter);
    CHECK(grad.defined());
  });
  {
    auto watch = diag.watch_forward(1);
    model->forward(b.x);
  }
  std::string trace;
  for (const auto& s : seen) trace += s + "; ";
  MESSAGE("ops: " << trace);
  CHECK(order == std::vector<std::string>{"layers.0", "layers.2", "layers.4"});

  {
    auto watch = diag.watch_forward(1);
    loss_of(model, b).backward();
  }
  diag.after_backward(1);
  CHECK(grads.size() == 6);
}

TEST_CASE("diagnostics: settings are checked") {
  CHECK_THROWS_AS(kiln::diagnostics({.every = -1}), kiln::config_error);
  CHECK_THROWS_AS(kiln::diagnostics({.explode_threshold = 0.0}), kiln::config_error);
  kiln::diagnostics_settings s;
  CHECK(kiln::validate(s).empty());
}
