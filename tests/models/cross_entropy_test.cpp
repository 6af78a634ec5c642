// Tests for kiln::models::cross_entropy: its value and gradient against LibTorch's
// cross_entropy over class counts that do and do not fill a vector, every dtype path (the fused
// fp32 and bf16 kernels, the LibTorch-op path for fp64), the edge cases LibTorch defines
// (ignored rows, a mean over nothing, -inf and NaN logits, a bad target), the exp it is built on
// against std::exp, and the point of it: nothing as large as the logits kept for backward.
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/errors.hpp"
#include "kiln/models/cross_entropy.hpp"
#include "kiln/models/detail/cross_entropy_kernel.hpp"  // the kernel itself, besides the op
#include "kiln/profiler/memory_meter.hpp"

#include <doctest/doctest.h>

namespace {

namespace F = torch::nn::functional;

// LibTorch's loss and gradient on fp64 copies: the reference.
struct reference {
  double loss;
  torch::Tensor grad;
};
reference libtorch_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  auto x = logits.detach().to(torch::kFloat64).requires_grad_(true);
  auto loss = F::cross_entropy(x, targets, F::CrossEntropyFuncOptions().ignore_index(-100));
  loss.backward();
  return {loss.item<double>(), x.grad()};
}

// Targets in [0, c) with every fifth one ignored.
torch::Tensor some_ignored_targets(std::int64_t rows, std::int64_t c) {
  auto t = torch::randint(c, {rows}, torch::kLong);
  t.slice(0, 0, rows, 5).fill_(-100);
  return t;
}

double max_abs_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_SUITE("cross_entropy") {
  TEST_CASE("exp_lanes is within 2 ulp of std::exp over softmax's range") {
    using V = kiln::detail::float_vec<4>;
    double worst = 0.0;
    for (int i = 0; i <= 200000; ++i) {
      V x{};
      for (int lane = 0; lane < 4; ++lane) x[lane] = -87.0f * static_cast<float>(i * 4 + lane) / 800000.0f;
      const V y = kiln::detail::exp_lanes(x);
      for (int lane = 0; lane < 4; ++lane) {
        const double exact = std::exp(static_cast<double>(x[lane]));
        worst = std::max(worst, std::abs(y[lane] - exact) / exact);
      }
    }
    CHECK(worst < 2.5e-7);  // 2 ulp of fp32 is 2.4e-7 at worst
    V special{};
    special[0] = -std::numeric_limits<float>::infinity();
    special[1] = std::numeric_limits<float>::quiet_NaN();
    special[2] = 0.0f;
    special[3] = -1000.0f;
    const V y = kiln::detail::exp_lanes(special);
    CHECK(y[0] < 1e-37f);
    CHECK(std::isnan(y[1]));
    CHECK(y[2] == 1.0f);
    CHECK(y[3] < 1e-37f);
  }

  TEST_CASE("fp32: loss and gradient equal LibTorch's for class counts in and out of vector width") {
    torch::manual_seed(0);
    for (std::int64_t c : {1, 3, 8, 10, 37, 64, 1000}) {
      CAPTURE(c);
      const auto logits = (3.0 * torch::randn({301, c})).requires_grad_(true);
      const auto targets = some_ignored_targets(301, c);
      const auto ref = libtorch_cross_entropy(logits, targets);
      const auto loss = kiln::models::cross_entropy(logits, targets);
      CHECK((loss.scalar_type() == torch::kFloat32));
      CHECK(loss.item<double>() == doctest::Approx(ref.loss).epsilon(1e-6));
      loss.backward();
      CHECK(max_abs_difference(logits.grad(), ref.grad) < 1e-8);
      // ignored rows get no gradient
      CHECK(logits.grad().slice(0, 0, 301, 5).abs().max().item<float>() == 0.0f);
    }
  }

  TEST_CASE("bf16 logits: an fp32 loss from the same values, a bf16 gradient rounded from the fp32 one") {
    torch::manual_seed(1);
    const auto logits = (2.0 * torch::randn({64, 3, 50})).to(torch::kBFloat16).requires_grad_(true);
    const auto targets = some_ignored_targets(192, 50).reshape({64, 3});
    const auto ref = libtorch_cross_entropy(logits.reshape({192, 50}), targets.reshape({192}));
    const auto loss = kiln::models::cross_entropy(logits, targets);
    CHECK((loss.scalar_type() == torch::kFloat32));
    CHECK(loss.item<double>() == doctest::Approx(ref.loss).epsilon(1e-6));
    loss.backward();
    CHECK((logits.grad().scalar_type() == torch::kBFloat16));
    CHECK((logits.grad().sizes() == logits.sizes()));
    // within half a bf16 ulp of the exact gradient, plus fp32 rounding
    const auto exact = ref.grad.reshape({64, 3, 50});
    CHECK(((logits.grad().to(torch::kFloat64) - exact).abs() <= exact.abs() * (1.0 / 256) + 1e-9).all().item<bool>());
  }

  // The CPU picks one width per process (8 lanes with AVX2, else 4), so each kernel is run here
  // directly: whichever one a machine dispatches to has been checked on every machine.
  TEST_CASE("the 4-lane and 8-lane kernels both agree with LibTorch, at small and large logits") {
    torch::manual_seed(4);
    const std::int64_t rows = 64, c = 37;
    auto logits = 3.0 * torch::randn({rows, c});
    logits.slice(0, 0, 16) += 10000.0;  // an ulp of 1e4 is 1e-3
    const auto targets = some_ignored_targets(rows, c);
    const auto ref = libtorch_cross_entropy(logits, targets);
    const auto scored = targets.ne(-100).sum().item<std::int64_t>();
    auto check_width = [&]<int Width>() {
      CAPTURE(Width);
      std::vector<kiln::detail::row_normaliser> norm(rows);
      std::vector<double> row_loss(rows);
      std::int64_t bad_row = -1;
      kiln::detail::cross_entropy_forward_range<Width>(logits.data_ptr<float>(), targets.data_ptr<std::int64_t>(), 0,
                                                       rows, c, -100, norm.data(), row_loss.data(), bad_row);
      CHECK(bad_row == -1);
      double sum = 0.0;
      for (double l : row_loss) sum += l;
      CHECK(sum / static_cast<double>(scored) == doctest::Approx(ref.loss).epsilon(1e-6));
      auto grad = torch::empty_like(logits);
      kiln::detail::cross_entropy_backward_range<Width>(logits.data_ptr<float>(), targets.data_ptr<std::int64_t>(),
                                                        norm.data(), 0, rows, c, -100,
                                                        1.0f / static_cast<float>(scored), grad.data_ptr<float>());
      CHECK(max_abs_difference(grad, ref.grad) < 1e-8);
    };
    check_width.operator()<4>();
    check_width.operator()<8>();
  }

  TEST_CASE("fp16 logits: fused on the CPU, an fp32 loss, an fp16 gradient rounded from the fp32 one") {
    torch::manual_seed(5);
    const auto logits = (2.0 * torch::randn({61, 70})).to(torch::kHalf).requires_grad_(true);
    const auto targets = some_ignored_targets(61, 70);
    const auto ref = libtorch_cross_entropy(logits, targets);
    const auto loss = kiln::models::cross_entropy(logits, targets);
    CHECK((loss.scalar_type() == torch::kFloat32));
    CHECK(loss.item<double>() == doctest::Approx(ref.loss).epsilon(1e-6));
    loss.backward();
    CHECK((logits.grad().scalar_type() == torch::kHalf));
    // within half an fp16 ulp (2^-11 relative; subnormals 2^-25 absolute) of the exact gradient, plus fp32 rounding
    CHECK(((logits.grad().to(torch::kFloat64) - ref.grad).abs() <= ref.grad.abs() * (1.0 / 2048 + 1e-6) + 3e-8)
              .all()
              .item<bool>());
  }

  TEST_CASE("fp64 logits take the LibTorch-op path and agree to fp64 rounding") {
    torch::manual_seed(2);
    const auto logits = (5.0 * torch::randn({97, 13}, torch::kFloat64)).requires_grad_(true);
    const auto targets = some_ignored_targets(97, 13);
    const auto ref = libtorch_cross_entropy(logits, targets);
    const auto loss = kiln::models::cross_entropy(logits, targets);
    CHECK((loss.scalar_type() == torch::kFloat64));
    CHECK(loss.item<double>() == doctest::Approx(ref.loss).epsilon(1e-12));
    loss.backward();
    CHECK(max_abs_difference(logits.grad(), ref.grad) < 1e-15);
  }

  TEST_CASE("large, -inf and NaN logits, and a mean over no rows, as LibTorch defines them") {
    torch::manual_seed(3);
    auto logits = torch::randn({40, 21}) * 1e4;
    logits.index_put_({torch::indexing::Slice(), torch::indexing::Slice(15, 21)},
                      -std::numeric_limits<float>::infinity());  // masked classes
    // Rows whose two largest logits are near 1e4 and close, so that their softmax is not one-hot:
    // recomputed from an fp32 log-sum-exp (an ulp of 1e4 is 1e-3) their gradient would be off by
    // ~7e-6; kiln keeps each row's max and log-sum apart, which LibTorch's precision needs.
    for (int r = 0; r < 8; ++r) {
      logits[r].slice(0, 0, 15).fill_(-5000.0f);
      logits[r][0] = 10000.0f + 0.37f * static_cast<float>(r);
      logits[r][1] = 10000.5f + 0.113f * static_cast<float>(r);
    }
    const auto targets = torch::randint(15, {40}, torch::kLong);
    const auto x = logits.clone().requires_grad_(true);
    const auto ref = libtorch_cross_entropy(logits, targets);
    const auto loss = kiln::models::cross_entropy(x, targets);
    CHECK(loss.item<double>() == doctest::Approx(ref.loss).epsilon(1e-6));
    loss.backward();
    CHECK(max_abs_difference(x.grad(), ref.grad) < 1e-7);

    auto with_nan = torch::randn({8, 10});
    with_nan[3][4] = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(kiln::models::cross_entropy(with_nan, torch::zeros({8}, torch::kLong)).item<float>()));
    CHECK(std::isnan(kiln::models::cross_entropy(torch::randn({4, 10}), torch::full({4}, -100, torch::kLong)).item<float>()));
  }

  TEST_CASE("a target out of range names the row and value, and wrong shapes and dtypes are config errors") {
    auto targets = torch::zeros({6}, torch::kLong);
    targets[4] = 10;
    try {
      kiln::models::cross_entropy(torch::randn({6, 10}), targets);
      FAIL("no error");
    } catch (const std::out_of_range& e) {
      CHECK(std::string(e.what()).find("target 10 at row 4 is outside [0, 10)") != std::string::npos);
    }
    CHECK_THROWS_AS(kiln::models::cross_entropy(torch::randn({6, 10}, torch::kFloat64), targets), std::out_of_range);
    CHECK_THROWS_AS(kiln::models::cross_entropy(torch::randn({6, 10}), torch::zeros({6})), kiln::config_error);
    CHECK_THROWS_AS(kiln::models::cross_entropy(torch::randn({6, 10}), torch::zeros({5}, torch::kLong)), kiln::config_error);
    CHECK_THROWS_AS(kiln::models::cross_entropy(torch::randn({6}), torch::zeros({6}, torch::kLong)), kiln::config_error);
  }

  TEST_CASE("the loss does not depend on the thread count") {
    torch::manual_seed(3);
    const auto logits = torch::randn({4096, 64});
    const auto targets = torch::randint(64, {4096}, torch::kLong);
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const auto one = kiln::models::cross_entropy(logits, targets);
    at::set_num_threads(std::max(2, threads));
    const auto many = kiln::models::cross_entropy(logits, targets);
    at::set_num_threads(threads);
    CHECK(torch::equal(one, many));
  }

  TEST_CASE("nothing as large as the logits is kept for backward: two fp32 numbers per row") {
    const std::int64_t rows = 512, classes = 256;
    for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
      const auto logits = torch::randn({rows, classes}).to(dtype).requires_grad_(true);
      const auto targets = torch::randint(classes, {rows}, torch::kLong);
      auto held_by = [&](auto&& loss_of) {
        kiln::memory_meter meter;
        meter.start();
        const auto loss = loss_of();
        meter.stop();
        return meter.current();
      };
      const auto kiln_held = held_by([&] { return kiln::models::cross_entropy(logits, targets); });
      CHECK(kiln_held <= rows * 8 + 1024);  // each row's max and log-sum, the loss, the row count
      // LibTorch's, as autocast runs it (an fp32 loss), keeps fp32 log-probabilities of every class
      const auto libtorch_held = held_by([&] { return F::cross_entropy(logits.to(torch::kFloat32), targets); });
      CHECK(libtorch_held >= rows * classes * 4);
    }
  }
}
