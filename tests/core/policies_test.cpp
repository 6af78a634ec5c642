// Composition: a pack of policies in any order resolves to one policy per axis, with defaults.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>

TEST_SUITE("policies") {
  TEST_CASE("a pack in any order resolves each axis, missing axes take their defaults") {
    using a = kiln::policy_pack<kiln::optim::adamw, kiln::precision::fp32>;
    using b = kiln::policy_pack<kiln::precision::fp32, kiln::optim::adamw>;
    CHECK(std::is_same_v<a::optimizer, kiln::optim::adamw>);
    CHECK(std::is_same_v<b::optimizer, kiln::optim::adamw>);
    CHECK(std::is_same_v<a::precision, b::precision>);
    CHECK(std::is_same_v<a::sharding, kiln::sharding::single>);
    CHECK(std::is_same_v<a::accumulation, kiln::accumulation::steps>);
    CHECK(std::is_same_v<a::checkpointing, kiln::checkpointing::none>);
    CHECK(std::is_same_v<a::profiler, kiln::profiler::none>);
    CHECK(a::valid);

    using empty = kiln::policy_pack<>;
    CHECK(std::is_same_v<empty::optimizer, kiln::defaults::optimizer>);
    CHECK(std::is_same_v<kiln::trainer<kiln::optim::adamw>::accelerator_t::optimizer_t, kiln::optim::adamw>);
  }

  TEST_CASE("every shipped policy satisfies its axis concept") {
    CHECK(kiln::precision_policy<kiln::precision::fp32>);
    CHECK(kiln::accumulation_policy<kiln::accumulation::steps>);
    CHECK(kiln::checkpointing_policy<kiln::checkpointing::none>);
    CHECK(kiln::sharding_policy<kiln::sharding::single>);
    CHECK(kiln::optimizer_policy<kiln::optim::sgd>);
    CHECK(kiln::optimizer_policy<kiln::optim::adamw>);
    CHECK(kiln::profiler_policy<kiln::profiler::none>);
    // and no policy satisfies another axis's concept
    CHECK_FALSE(kiln::precision_policy<kiln::optim::sgd>);
    CHECK_FALSE(kiln::optimizer_policy<kiln::precision::fp32>);
  }

  TEST_CASE("settings built in C++ are validated like recipe values") {
    kiln::optim::adamw::settings s;
    s.lr = -1;
    s.beta2 = 1.0;
    auto errors = kiln::validate(s, "optimizer");
    REQUIRE(errors.size() == 2);
    CHECK(errors[0] == "optimizer.lr = -1: expected a value > 0");
    CHECK(errors[1] == "optimizer.beta2 = 1: expected a value in [0, 1)");
  }
}
