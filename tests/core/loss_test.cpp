// The loss component: regression and language modelling train to stated losses, evaluation
// reports each loss's metrics as computed independently, and a user's loss is the one trained.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <string>

namespace {

using adamw_trainer = kiln::trainer<kiln::optim::adamw>;

adamw_trainer::settings quiet(std::int64_t steps, double lr) {
  adamw_trainer::settings s;
  s.accelerator.optimizer.lr = lr;
  s.accelerator.optimizer.weight_decay = 0.0;
  s.options.steps = steps;
  s.options.progress = false;
  s.options.threads = 2;
  return s;
}

const kiln::metric_value& metric(const kiln::eval_info& e, const std::string& name) {
  for (const auto& m : e.metrics)
    if (m.name == name) return m;
  FAIL("no metric " << name);
  throw;
}

// A half cross-entropy: what a user would write for a loss of their own.
struct half_cross_entropy {
  static constexpr std::string_view kind = "half-cross-entropy";
  template <class V>
  void describe(V&) {}
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
    return 0.5 * torch::nn::functional::cross_entropy(logits, targets);
  }
};

}  // namespace

TEST_SUITE("loss") {
  TEST_CASE("regression: an MLP fits noisy teacher targets to an mse near the noise floor") {
    torch::manual_seed(0);
    const double noise = 0.1;  // the best mse is noise^2 = 0.01; predicting the mean gives about 1
    auto all = kiln::data::make_regression(6144, 8, 2, noise, /*seed=*/5);
    kiln::data::tensor_pair train{all.inputs.slice(0, 0, 4096), all.targets.slice(0, 0, 4096)};
    kiln::data::tensor_pair test{all.inputs.slice(0, 4096), all.targets.slice(0, 4096)};
    const double variance = test.targets.var().item<double>();
    CHECK(variance > 0.5);
    CHECK(variance < 2.0);

    kiln::data::batch_loader loader(train, {.batch_size = 64});
    kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 8, .hidden = {64, 64}, .classes = 2});
    auto s = quiet(800, 3e-3);
    s.options.loss = kiln::losses::mse{};
    adamw_trainer trainer(s);
    auto summary = trainer.fit(model, loader, &test);
    REQUIRE(summary.evaluated);
    CAPTURE(summary.final_eval.loss);
    CHECK(summary.final_eval.loss < 0.1 * variance);

    // The reported numbers are LibTorch's own mse, mae and rmse over the test set.
    torch::NoGradGuard no_grad;
    model->eval();
    auto out = model->forward(test.inputs);
    const double mse = torch::mse_loss(out, test.targets).item<double>();
    CHECK(summary.final_eval.loss == doctest::Approx(mse).epsilon(1e-5));
    CHECK(metric(summary.final_eval, "mae").value ==
          doctest::Approx((out - test.targets).abs().mean().item<double>()).epsilon(1e-5));
    CHECK(metric(summary.final_eval, "rmse").value == doctest::Approx(std::sqrt(mse)).epsilon(1e-6));
    CHECK(summary.final_eval.samples == test.targets.numel());
  }

  TEST_CASE("l1 trains on the same data and reports mse") {
    torch::manual_seed(0);
    auto all = kiln::data::make_regression(3072, 8, 1, 0.1, 5);
    kiln::data::tensor_pair train{all.inputs.slice(0, 0, 2048), all.targets.slice(0, 0, 2048)};
    kiln::data::tensor_pair test{all.inputs.slice(0, 2048), all.targets.slice(0, 2048)};
    kiln::data::batch_loader loader(train, {.batch_size = 64});
    kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 8, .hidden = {64}, .classes = 1});
    auto s = quiet(400, 3e-3);
    s.options.loss = kiln::losses::l1{};
    adamw_trainer trainer(s);
    auto summary = trainer.fit(model, loader, &test);
    torch::NoGradGuard no_grad;
    model->eval();
    auto out = model->forward(test.inputs);
    CHECK(summary.final_eval.loss == doctest::Approx(torch::l1_loss(out, test.targets).item<double>()).epsilon(1e-5));
    CHECK(metric(summary.final_eval, "mse").value ==
          doctest::Approx(torch::mse_loss(out, test.targets).item<double>()).epsilon(1e-5));
    CHECK(summary.final_eval.loss < 0.35);  // the mean absolute deviation of the targets is about 0.8
  }

  TEST_CASE("language modelling: next-token loss per token, perplexity and bits per token") {
    torch::manual_seed(0);
    const std::int64_t vocab = 16, seq = 16;
    auto all = kiln::data::make_token_sequences(1536, seq, vocab, 3, /*min_len=*/8);  // padded: some targets ignored
    kiln::data::tensor_pair train{all.inputs.slice(0, 0, 1024), all.targets.slice(0, 0, 1024)};
    kiln::data::tensor_pair test{all.inputs.slice(0, 1024), all.targets.slice(0, 1024)};
    kiln::data::batch_loader loader(train, {.batch_size = 32});
    kiln::models::gpt model(kiln::models::gpt_settings{
        .vocab_size = vocab, .seq_len = seq, .d_model = 32, .n_layer = 1, .n_head = 2, .dropout = 0.0});
    auto s = quiet(300, 3e-3);
    s.options.loss = kiln::losses::next_token{};
    adamw_trainer trainer(s);
    auto summary = trainer.fit(model, loader, &test);
    const auto& e = summary.final_eval;
    CAPTURE(e.loss);
    CHECK(e.loss < 0.8 * std::log(static_cast<double>(vocab)));  // well below guessing uniformly
    CHECK(metric(e, "perplexity").value == doctest::Approx(std::exp(e.loss)));
    CHECK(metric(e, "bits_per_token").value == doctest::Approx(e.loss / std::log(2.0)));
    // The mean is over scored tokens, not sequences: LibTorch's mean cross-entropy with ignore_index.
    torch::NoGradGuard no_grad;
    model->eval();
    auto logits = model->forward(test.inputs);
    const double reference = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), test.targets.reshape({-1}))
                                 .item<double>();
    CHECK(e.loss == doctest::Approx(reference).epsilon(1e-5));
    CHECK(e.samples == test.targets.ne(kiln::ignore_index).sum().item<std::int64_t>());
  }

  TEST_CASE("a user's loss is the one trained: half the cross-entropy at twice the lr is the same SGD run") {
    using sgd_trainer = kiln::trainer<kiln::optim::sgd>;
    auto data = kiln::data::make_classification(512, 8, 3, 1);
    auto run = [&](kiln::loss_function loss, double lr) {
      torch::manual_seed(4);
      kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 8, .hidden = {16}, .classes = 3});
      kiln::data::batch_loader loader(data, {.batch_size = 32, .shuffle = false});
      sgd_trainer::settings s;
      s.accelerator.optimizer.lr = lr;
      s.options.steps = 20;
      s.options.progress = false;
      s.options.loss = std::move(loss);
      sgd_trainer trainer(s);
      trainer.fit(model, loader);
      return torch::cat({model->layers[0]->as<torch::nn::Linear>()->weight.flatten(),
                         model->layers[2]->as<torch::nn::Linear>()->weight.flatten()});
    };
    const auto reference = run(kiln::losses::cross_entropy{}, 0.05);
    const auto halved = run(half_cross_entropy{}, 0.1);
    const auto halved_same_lr = run(half_cross_entropy{}, 0.05);
    CHECK(torch::allclose(halved, reference, 1e-5, 1e-6));
    CHECK_FALSE(torch::allclose(halved_same_lr, reference, 1e-5, 1e-6));  // the test can tell
  }

  TEST_CASE("a loss given float targets of another shape says which loss and what it got") {
    kiln::losses::mse mse;
    CHECK_THROWS_WITH_AS(mse.loss(torch::zeros({4, 3}), torch::zeros({4}, torch::kLong)),
                         doctest::Contains("mse loss: the model's outputs [4, 3] and the targets [4] (Long)"),
                         kiln::config_error);
  }
}
