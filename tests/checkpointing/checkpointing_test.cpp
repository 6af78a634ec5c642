// Activation checkpointing against the plain forward: same gradients with dropout on, in every
// mode and under bf16 autocast; exactly two forwards of a checkpointed block per step; inputs
// that do not require grad; gradient hooks; clear errors for models without blocks.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

#include <atomic>

namespace {

kiln::models::gpt tiny_gpt() {
  torch::manual_seed(7);
  return kiln::models::gpt(
      kiln::models::gpt_settings{.vocab_size = 32, .seq_len = 16, .d_model = 32, .n_layer = 4, .n_head = 4, .dropout = 0.2});
}

// Gradients of one training step of a fresh tiny GPT with `Policy` applied, dropout on.
template <class Policy>
std::vector<torch::Tensor> gradients(typename Policy::settings settings, bool bf16 = false) {
  auto model = tiny_gpt();
  Policy(settings).apply(*model);
  auto data = kiln::data::make_token_sequences(8, 16, 32, 3);
  torch::manual_seed(11);  // the same dropout masks for every policy
  torch::Tensor loss;
  {
    std::optional<kiln::precision::detail::device_autocast> cast;
    if (bf16) cast.emplace(at::kBFloat16);
    auto logits = model->forward(data.inputs);
    loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 32}), data.targets.reshape({-1}));
  }
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

// A block that counts how often its forward body runs.
struct counting_block_impl : torch::nn::Module, kiln::checkpointable {
  torch::nn::Linear linear{nullptr};
  std::atomic<int> calls{0};
  counting_block_impl() {
    linear = register_module("linear", torch::nn::Linear(8, 8));
    set_body([this](const torch::Tensor& x) {
      ++calls;
      return torch::dropout(torch::tanh(linear->forward(x)), 0.3, is_training());
    });
  }
  torch::Tensor forward(const torch::Tensor& x) { return run_checkpointed(*this, x); }
};
TORCH_MODULE_IMPL(counting_block, counting_block_impl);

}  // namespace

TEST_SUITE("checkpointing") {
  TEST_CASE("checkpointed gradients equal plain ones with dropout on, for each mode") {
    const auto plain = gradients<kiln::checkpointing::none>({});
    CHECK(max_diff(plain, gradients<kiln::checkpointing::blocks>({})) <= 1e-6);
    CHECK(max_diff(plain, gradients<kiln::checkpointing::every_nth>({.every = 2})) <= 1e-6);
    CHECK(max_diff(plain, gradients<kiln::checkpointing::selective>({.modules = {"blocks.*.mlp"}})) <= 1e-6);
    CHECK(max_diff(plain, gradients<kiln::checkpointing::selective>({.modules = {"blocks.1", "blocks.*.attn"}})) <= 1e-6);
  }

  TEST_CASE("and under bf16 autocast") {
    const auto plain = gradients<kiln::checkpointing::none>({}, true);
    CHECK(max_diff(plain, gradients<kiln::checkpointing::blocks>({}, true)) <= 1e-6);
    CHECK(max_diff(plain, gradients<kiln::checkpointing::every_nth>({.every = 3}, true)) <= 1e-6);
  }

  TEST_CASE("a checkpointed block runs its forward exactly twice per step, a plain one once") {
    counting_block block;
    auto x = torch::randn({4, 8}, torch::requires_grad());
    block->forward(x).sum().backward();
    CHECK(block->calls == 1);
    block->set_checkpointed(true);
    block->calls = 0;
    block->forward(x).sum().backward();
    CHECK(block->calls == 2);
    block->calls = 0;
    {
      torch::NoGradGuard no_grad;  // evaluation: no recompute needed
      block->forward(x);
    }
    CHECK(block->calls == 1);
  }

  TEST_CASE("inputs that do not require grad still give parameter gradients, hooks fire") {
    counting_block plain, checkpointed;
    {
      torch::NoGradGuard no_grad;
      checkpointed->linear->weight.copy_(plain->linear->weight);
      checkpointed->linear->bias.copy_(plain->linear->bias);
    }
    checkpointed->set_checkpointed(true);
    int hooks = 0;
    checkpointed->linear->weight.register_hook([&](torch::Tensor g) {
      ++hooks;
      return g;
    });
    auto x = torch::randn({4, 8});  // requires_grad = false
    torch::manual_seed(3);
    plain->forward(x).pow(2).sum().backward();
    torch::manual_seed(3);
    checkpointed->forward(x).pow(2).sum().backward();
    REQUIRE(checkpointed->linear->weight.grad().defined());
    CHECK((checkpointed->linear->weight.grad() - plain->linear->weight.grad()).abs().max().item<double>() <= 1e-6);
    CHECK(hooks == 1);
  }

  TEST_CASE("every tensor the block reads gets its gradient, also one not listed among its parameters") {
    auto w = torch::randn({8, 8}, torch::requires_grad());
    auto scale = torch::full({1}, 2.0, torch::requires_grad());  // read by fn, not passed as a parameter
    const std::function<torch::Tensor(const torch::Tensor&)> fn = [&](const torch::Tensor& in) {
      return torch::tanh(in.matmul(w)) * scale;
    };
    auto x = torch::randn({4, 8}, torch::requires_grad());
    fn(x).pow(2).sum().backward();
    const auto plain_w = w.grad().clone(), plain_scale = scale.grad().clone(), plain_x = x.grad().clone();
    for (auto* t : {&w, &scale, &x}) t->mutable_grad().reset();
    kiln::checkpoint(fn, x, {w}).pow(2).sum().backward();
    REQUIRE(scale.grad().defined());
    CHECK((w.grad() - plain_w).abs().max().item<double>() <= 1e-6);
    CHECK((scale.grad() - plain_scale).abs().max().item<double>() <= 1e-5);
    CHECK((x.grad() - plain_x).abs().max().item<double>() <= 1e-6);
  }

  TEST_CASE("the caller's RNG stream continues as if nothing had been recomputed") {
    counting_block a, b;
    b->set_checkpointed(true);
    auto x = torch::randn({4, 8}, torch::requires_grad());
    torch::manual_seed(5);
    a->forward(x).sum().backward();
    auto after_plain = torch::rand({3});
    torch::manual_seed(5);
    b->forward(x).sum().backward();
    auto after_checkpointed = torch::rand({3});
    CHECK(torch::equal(after_plain, after_checkpointed));
  }

  TEST_CASE("models without blocks and patterns that match nothing are refused by name") {
    kiln::models::mlp mlp(kiln::models::mlp_settings{.in_features = 4, .hidden = {8}, .classes = 2});
    CHECK_THROWS_WITH_AS(kiln::checkpointing::blocks(kiln::checkpointing::blocks::settings{}).apply(*mlp), doctest::Contains("no modules named blocks.N"),
                         kiln::config_error);
    auto gpt = tiny_gpt();
    CHECK_THROWS_WITH_AS(kiln::checkpointing::selective({.modules = {"blocks.*.nothing"}}).apply(*gpt),
                         doctest::Contains("matches no module"), kiln::config_error);
    CHECK_THROWS_WITH_AS(kiln::checkpointing::selective({.modules = {"blocks.0.ln1"}}).apply(*gpt),
                         doctest::Contains("selects module blocks.0.ln1"), kiln::config_error);
    CHECK(kiln::detail::glob_match("blocks.*.mlp", "blocks.12.mlp"));
    CHECK_FALSE(kiln::detail::glob_match("blocks.*", "blocks.1.mlp"));
    CHECK(kiln::detail::glob_match("**mlp", "blocks.1.mlp"));
  }

  TEST_CASE("a checkpointed GPT trains through the trainer like a plain one") {
    auto run = [](auto policy_tag) {
      using policy = decltype(policy_tag);
      using trainer_t = kiln::trainer<kiln::optim::adamw, policy>;
      auto model = tiny_gpt();
      kiln::data::batch_loader loader(kiln::data::make_token_sequences(64, 16, 32, 1), {.batch_size = 8});
      typename trainer_t::settings s;
      s.options.steps = 6;
      s.options.progress = false;
      trainer_t t(s);
      return t.fit(model, loader).final_train_loss;
    };
    const double checkpointed = run(kiln::checkpointing::blocks(kiln::checkpointing::blocks::settings{}));
    const double plain = run(kiln::checkpointing::none(kiln::checkpointing::none::settings{}));
    CHECK(checkpointed == doctest::Approx(plain).epsilon(1e-5));
  }
}
