// Learning-rate schedules against hand-computed values, and a schedule of the user's own.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

namespace {

// A schedule kind that is not kiln's: halve the lr every `every` steps.
struct step_decay {
  static constexpr std::string_view kind = "step-decay";
  std::int64_t every = 10;
  template <class V>
  void describe(V& v) {
    v.field("every", every, "steps between halvings", kiln::checks::positive);
  }
  double factor(std::int64_t step, std::int64_t /*total*/) const {
    return std::pow(0.5, static_cast<double>(step / every));
  }
};

}  // namespace

TEST_SUITE("schedule") {
  TEST_CASE("linear warmup then constant, linear and cosine decay") {
    const kiln::schedule constant = kiln::schedules::constant{.warmup_steps = 4};
    CHECK(constant.kind() == "constant");
    CHECK(constant.factor(0, 100) == doctest::Approx(1.0 / 5));
    CHECK(constant.factor(3, 100) == doctest::Approx(4.0 / 5));
    CHECK(constant.factor(4, 100) == 1.0);
    CHECK(constant.factor(99, 100) == 1.0);

    // after warmup: 1 - (step - 4) / 96
    const kiln::schedule linear = kiln::schedules::linear{.warmup_steps = 4};
    CHECK(linear.factor(3, 100) == doctest::Approx(4.0 / 5));
    CHECK(linear.factor(4, 100) == doctest::Approx(1.0));
    CHECK(linear.factor(52, 100) == doctest::Approx(0.5));
    CHECK(linear.factor(100, 100) == doctest::Approx(0.0));

    const kiln::schedule cosine = kiln::schedules::cosine{.warmup_steps = 4, .min_factor = 0.1};
    CHECK(cosine.factor(4, 100) == doctest::Approx(1.0));
    CHECK(cosine.factor(52, 100) == doctest::Approx(0.1 + 0.9 * 0.5));
    CHECK(cosine.factor(28, 100) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25))));
    CHECK(cosine.factor(100, 100) == doctest::Approx(0.1));
    REQUIRE(cosine.get_if<kiln::schedules::cosine>() != nullptr);
    CHECK(cosine.get_if<kiln::schedules::cosine>()->min_factor == 0.1);
    CHECK(cosine.get_if<kiln::schedules::linear>() == nullptr);
  }

  TEST_CASE("a schedule of the user's own drives the accelerator's lr and is validated like kiln's") {
    torch::manual_seed(0);
    torch::nn::Linear model(4, 1);
    using acc_t = kiln::accelerator<kiln::optim::sgd>;
    acc_t acc({.optimizer = {.lr = 0.4}, .scheduler = step_decay{.every = 2}, .total_steps = 6});
    acc.prepare(*model);
    std::vector<double> lrs;
    for (int i = 0; i < 6; ++i) {
      acc.backward(model->forward(torch::ones({2, 4})).sum());
      lrs.push_back(acc.step().lr);
    }
    CHECK(lrs == std::vector<double>{0.4, 0.4, 0.2, 0.2, 0.1, 0.1});

    std::string message;
    try {
      acc_t bad({.scheduler = step_decay{.every = 0}});
    } catch (const kiln::config_error& e) {
      message = e.what();
    }
    CHECK(message == "scheduler.every = 0: expected a value > 0");
  }
}
