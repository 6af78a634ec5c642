// Learning-rate schedules against hand-computed values.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

TEST_SUITE("schedule") {
  TEST_CASE("linear warmup then constant, linear and cosine decay") {
    kiln::schedule_settings s{.kind = "constant", .warmup_steps = 4, .min_factor = 0.0};
    CHECK(kiln::schedule_factor(s, 0, 100) == doctest::Approx(1.0 / 5));
    CHECK(kiln::schedule_factor(s, 3, 100) == doctest::Approx(4.0 / 5));
    CHECK(kiln::schedule_factor(s, 4, 100) == 1.0);
    CHECK(kiln::schedule_factor(s, 99, 100) == 1.0);

    s.kind = "linear";
    // after warmup: 1 - (step - 4) / 96
    CHECK(kiln::schedule_factor(s, 4, 100) == doctest::Approx(1.0));
    CHECK(kiln::schedule_factor(s, 52, 100) == doctest::Approx(0.5));
    CHECK(kiln::schedule_factor(s, 100, 100) == doctest::Approx(0.0));

    s.kind = "cosine";
    s.min_factor = 0.1;
    CHECK(kiln::schedule_factor(s, 4, 100) == doctest::Approx(1.0));
    CHECK(kiln::schedule_factor(s, 52, 100) == doctest::Approx(0.1 + 0.9 * 0.5));
    CHECK(kiln::schedule_factor(s, 28, 100) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25))));
    CHECK(kiln::schedule_factor(s, 100, 100) == doctest::Approx(0.1));
  }
}
