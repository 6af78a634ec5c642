// The accelerator against independent references: accumulation against one big batch,
// clipping against LibTorch's clip_grad_norm_, the schedule against hand-computed lrs.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

namespace {

kiln::models::mlp small_mlp(std::uint64_t seed) {
  torch::manual_seed(seed);
  return kiln::models::mlp(kiln::models::mlp_settings{.in_features = 12, .hidden = {32, 16}, .classes = 5});
}

double max_abs_diff(torch::nn::Module& a, torch::nn::Module& b) {
  double diff = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) diff = std::max(diff, (pa[i] - pb[i]).abs().max().item<double>());
  return diff;
}

torch::Tensor loss_of(kiln::models::mlp& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(model->forward(x), y);
}

}  // namespace

TEST_SUITE("accelerator") {
  TEST_CASE("accumulation 4 x 16 gives the update of 1 x 64") {
    auto data = kiln::data::make_classification(64, 12, 5, 1);
    auto one = small_mlp(3), four = small_mlp(3);
    using acc_t = kiln::accelerator<kiln::optim::sgd>;
    // SGD without momentum and lr = 1: the update is exactly the accumulated gradient.
    acc_t big({.optimizer = {.lr = 1.0, .momentum = 0.0}});
    acc_t accumulated({.accumulation = {.steps = 4}, .optimizer = {.lr = 1.0, .momentum = 0.0}});
    big.prepare(one);
    accumulated.prepare(four);

    big.backward(loss_of(one, data.inputs, data.targets));
    CHECK(big.step().stepped);

    for (int micro = 0; micro < 4; ++micro) {
      CHECK(accumulated.is_sync_step() == (micro == 3));
      auto x = data.inputs.slice(0, micro * 16, (micro + 1) * 16), y = data.targets.slice(0, micro * 16, (micro + 1) * 16);
      accumulated.backward(loss_of(four, x, y));
      auto r = accumulated.step();
      CHECK(r.stepped == (micro == 3));
    }
    CHECK(accumulated.optimizer_steps() == 1);
    CHECK(max_abs_diff(*one, *four) <= 1e-6);
  }

  // Micro-batches of 10, 22, 14 and 18 samples: the gradient of their union is sum/64, not the
  // mean of four means (transformers #34191).
  TEST_CASE("uneven micro-batches under sample normalisation give the update of their union") {
    auto data = kiln::data::make_classification(64, 12, 5, 11);
    const std::int64_t bounds[] = {0, 10, 32, 46, 64};
    auto run = [&](kiln::loss_unit normalize) {
      auto model = small_mlp(3);
      kiln::accelerator<kiln::optim::sgd> acc(
          {.accumulation = {.steps = 4, .normalize = normalize}, .optimizer = {.lr = 1.0, .momentum = 0.0}});
      acc.prepare(model);
      for (int micro = 0; micro < 4; ++micro) {
        auto x = data.inputs.slice(0, bounds[micro], bounds[micro + 1]);
        auto y = data.targets.slice(0, bounds[micro], bounds[micro + 1]);
        acc.backward(loss_of(model, x, y), static_cast<double>(y.size(0)));
        acc.step();
      }
      CHECK(acc.optimizer_steps() == 1);
      return model;
    };
    auto one = small_mlp(3);
    kiln::accelerator<kiln::optim::sgd> big({.optimizer = {.lr = 1.0, .momentum = 0.0}});
    big.prepare(one);
    big.backward(loss_of(one, data.inputs, data.targets));
    big.step();

    auto by_samples = run(kiln::loss_unit::sample);
    CHECK(max_abs_diff(*one, *by_samples) <= 1e-6);
    auto by_mean = run(kiln::loss_unit::micro_batch);  // the reference is sharp enough to see the mean-of-means bias
    CHECK(max_abs_diff(*one, *by_mean) > 1e-4);
  }

  // Sequences with padding (-100 targets) of different lengths: token normalisation gives the
  // mean over all real tokens of the window, as one batch of the union does.
  TEST_CASE("uneven token counts under token normalisation give the update of their union") {
    torch::manual_seed(12);
    const std::int64_t sequences = 16, length = 8, classes = 5;
    auto inputs = torch::randn({sequences, length, 12});
    auto targets = torch::randint(classes, {sequences, length}, torch::kInt64);
    for (std::int64_t s = 0; s < sequences; ++s) targets[s].slice(0, 1 + (s * 5) % length) = -100;  // 1..8 real tokens
    auto loss_fn = [](kiln::models::mlp& m, const torch::Tensor& x, const torch::Tensor& y) {
      return kiln::detail::classification_loss(m->forward(x.reshape({-1, 12})), y);
    };
    auto one = small_mlp(5), four = small_mlp(5);
    kiln::accelerator<kiln::optim::sgd> big({.optimizer = {.lr = 1.0, .momentum = 0.0}});
    kiln::accelerator<kiln::optim::sgd> acc(
        {.accumulation = {.steps = 4, .normalize = kiln::loss_unit::token}, .optimizer = {.lr = 1.0, .momentum = 0.0}});
    big.prepare(one);
    acc.prepare(four);
    big.backward(loss_fn(one, inputs, targets));
    big.step();
    const std::int64_t bounds[] = {0, 3, 9, 10, 16};
    for (int micro = 0; micro < 4; ++micro) {
      auto x = inputs.slice(0, bounds[micro], bounds[micro + 1]), y = targets.slice(0, bounds[micro], bounds[micro + 1]);
      const double tokens = kiln::detail::loss_items(kiln::loss_unit::token, y);
      CHECK(tokens == doctest::Approx(y.ne(-100).sum().item<double>()));
      acc.backward(loss_fn(four, x, y), tokens);
      CHECK(acc.step().stepped == (micro == 3));
    }
    CHECK(max_abs_diff(*one, *four) <= 1e-6);
  }

  // DDP averages the ranks' gradients; with token normalisation each rank must then weigh its
  // tokens by the job's count, not its own. Two ranks simulated in one process: each has its own
  // policy and gradients, the DDP average is taken by hand, and rank_mean answers with what the
  // all-reduce of the counts would.
  TEST_CASE("token normalisation across ranks: the averaged gradient is that of the union's tokens") {
    torch::manual_seed(21);
    const std::int64_t sequences = 16, length = 8;
    auto inputs = torch::randn({sequences, length, 12});
    auto targets = torch::randint(5, {sequences, length}, torch::kInt64);
    // Rank 0's sequences hold 1 to 3 real tokens (15 in all), rank 1's 4 to 8 (49).
    for (std::int64_t s = 0; s < sequences; ++s) targets[s].slice(0, s < 8 ? 1 + s % 3 : 4 + s % 5) = -100;
    auto loss_fn = [](kiln::models::mlp& m, const torch::Tensor& x, const torch::Tensor& y) {
      return kiln::detail::classification_loss(m->forward(x.reshape({-1, 12})), y);
    };
    // Rank r's micro-batch m: sequences [bounds[r][m], bounds[r][m + 1]).
    const std::int64_t bounds[2][3] = {{0, 3, 8}, {8, 10, 16}};
    auto tokens_in = [&](std::int64_t begin, std::int64_t end) {
      return targets.slice(0, begin, end).ne(-100).sum().item<double>();
    };
    const double first_mean = (tokens_in(0, 3) + tokens_in(8, 10)) / 2;
    const double window_mean = (tokens_in(0, 8) + tokens_in(8, 16)) / 2;

    // Gradients of each rank's window after the policy's correction, averaged as DDP does.
    auto ddp_gradients = [&](bool across_ranks) {
      std::vector<torch::Tensor> sum;
      for (int rank = 0; rank < 2; ++rank) {
        auto model = small_mlp(6);
        kiln::accumulation::steps policy({.steps = 2, .normalize = kiln::loss_unit::token});
        int calls = 0;  // the policy asks for the first micro-batch's mean, then the window's
        kiln::rank_mean mean = [&](double) { return ++calls == 1 ? first_mean : window_mean; };
        if (!across_ranks) mean = nullptr;
        for (int micro = 0; micro < 2; ++micro) {
          const auto begin = bounds[rank][micro], end = bounds[rank][micro + 1];
          policy.normalize(loss_fn(model, inputs.slice(0, begin, end), targets.slice(0, begin, end)),
                           tokens_in(begin, end), mean)
              .backward();
        }
        const double factor = policy.end_window(mean);
        if (across_ranks) CHECK(calls == 2);
        auto params = model->parameters();
        for (std::size_t i = 0; i < params.size(); ++i) {
          auto g = params[i].grad() * factor / 2;
          if (sum.size() <= i) sum.push_back(g);
          else sum[i] += g;
        }
      }
      return sum;
    };
    auto union_model = small_mlp(6);
    loss_fn(union_model, inputs, targets).backward();
    auto distance = [&](const std::vector<torch::Tensor>& gradients) {
      double worst = 0;
      auto params = union_model->parameters();
      for (std::size_t i = 0; i < params.size(); ++i)
        worst = std::max(worst, (gradients[i] - params[i].grad()).abs().max().item<double>());
      return worst;
    };
    CHECK(distance(ddp_gradients(true)) <= 1e-6);
    CHECK(distance(ddp_gradients(false)) > 1e-3);  // each rank's own tokens: a mean of means
  }

  TEST_CASE("a shortened window (an epoch's last) steps with the mean over what it holds") {
    auto data = kiln::data::make_classification(48, 12, 5, 13);
    auto one = small_mlp(7), three = small_mlp(7);
    kiln::accelerator<kiln::optim::sgd> big({.optimizer = {.lr = 1.0, .momentum = 0.0}});
    kiln::accelerator<kiln::optim::sgd> acc({.accumulation = {.steps = 4}, .optimizer = {.lr = 1.0, .momentum = 0.0}});
    big.prepare(one);
    acc.prepare(three);
    big.backward(loss_of(one, data.inputs, data.targets));
    big.step();
    acc.begin_window(3);
    for (int micro = 0; micro < 3; ++micro) {
      acc.backward(loss_of(three, data.inputs.slice(0, micro * 16, micro * 16 + 16),
                           data.targets.slice(0, micro * 16, micro * 16 + 16)));
      CHECK(acc.step().stepped == (micro == 2));
    }
    CHECK(max_abs_diff(*one, *three) <= 1e-6);
    CHECK(acc.is_sync_step() == false);  // the next window is full length again
    CHECK_THROWS_AS(acc.begin_window(5), kiln::config_error);
  }

  TEST_CASE("accumulate() scopes step the optimizer at the end of each window") {
    auto data = kiln::data::make_classification(64, 12, 5, 2);
    auto model = small_mlp(4);
    kiln::accelerator<kiln::optim::sgd> acc({.accumulation = {.steps = 2}, .optimizer = {.lr = 0.1}});
    acc.prepare(model);
    for (int i = 0; i < 6; ++i) {
      auto micro = acc.accumulate();
      CHECK(micro.sync() == (i % 2 == 1));
      acc.backward(loss_of(model, data.inputs.slice(0, i * 8, i * 8 + 8), data.targets.slice(0, i * 8, i * 8 + 8)));
    }
    CHECK(acc.optimizer_steps() == 3);
  }

  TEST_CASE("clipping by global norm matches torch::nn::utils::clip_grad_norm_") {
    auto data = kiln::data::make_classification(32, 12, 5, 5);
    auto a = small_mlp(6), b = small_mlp(6);
    kiln::accelerator<kiln::optim::sgd> acc({.optimizer = {.lr = 0.5, .momentum = 0.0}, .clip_grad_norm = 0.05});
    acc.prepare(a);
    acc.backward(loss_of(a, data.inputs, data.targets));
    auto result = acc.step();

    // reference: plain LibTorch
    loss_of(b, data.inputs, data.targets).backward();
    double norm = 0;
    for (auto& p : b->parameters()) norm += p.grad().pow(2).sum().item<double>();
    norm = std::sqrt(norm);
    CHECK(result.grad_norm == doctest::Approx(norm).epsilon(1e-5));
    REQUIRE(norm > 0.05);  // the test must actually clip
    torch::nn::utils::clip_grad_norm_(b->parameters(), 0.05);
    torch::optim::SGD sgd(b->parameters(), torch::optim::SGDOptions(0.5));
    sgd.step();
    CHECK(max_abs_diff(*a, *b) <= 1e-7);
  }

  TEST_CASE("the schedule sets the lr of every optimizer step") {
    auto data = kiln::data::make_classification(32, 12, 5, 7);
    auto model = small_mlp(8);
    kiln::accelerator<kiln::optim::adamw> acc(
        {.optimizer = {.lr = 1e-2}, .scheduler = kiln::schedules::linear{.warmup_steps = 2}, .total_steps = 10});
    acc.prepare(model);
    std::vector<double> lrs;
    for (int i = 0; i < 10; ++i) {
      acc.backward(loss_of(model, data.inputs, data.targets));
      lrs.push_back(acc.step().lr);
    }
    CHECK(lrs[0] == doctest::Approx(1e-2 / 3));
    CHECK(lrs[1] == doctest::Approx(2e-2 / 3));
    CHECK(lrs[2] == doctest::Approx(1e-2));
    CHECK(lrs[6] == doctest::Approx(1e-2 * 0.5));
    CHECK(lrs[9] == doctest::Approx(1e-2 * 1.0 / 8));
  }
}
