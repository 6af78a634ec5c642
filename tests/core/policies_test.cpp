// Composition: a pack of policies in any order resolves to one policy per axis, with defaults.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/recipes.hpp>

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

  TEST_CASE("the registry names each policy by its own kind and C++ type") {
    const auto* adamw = kiln::find_policy_kind("optimizer", kiln::optim::adamw::kind);
    REQUIRE(adamw != nullptr);
    CHECK(adamw->type == "kiln::optim::adamw");
    CHECK(kiln::find_policy_kind("optimizer", kiln::optim::sgd::kind) != nullptr);
    CHECK(kiln::find_policy_kind("precision", kiln::optim::sgd::kind) == nullptr);
    CHECK(kiln::policy_type("profiler", "ops+memory") ==
          "kiln::profiler::profile<kiln::profiler::ops_collector, kiln::profiler::memory_collector>");
    CHECK(kiln::profile_all_kind() == "ops+trace+memory+phases");
    // kiln's own kinds are listed in builtin_kinds.hpp's order
    CHECK(kiln::kinds_on_axis("optimizer") == std::vector<std::string>{"sgd", "adamw", "adafactor", "adam8bit", "lion"});
    CHECK(kiln::kind_names(kiln::registered_models()) == std::vector<std::string>{"mlp", "cnn", "gpt"});
    CHECK(kiln::default_kind("optimizer") == kiln::defaults::optimizer::kind);
    CHECK(kiln::default_kind("precision") == kiln::defaults::precision::kind);
    CHECK(kiln::default_kind("accumulation") == kiln::defaults::accumulation::kind);
    CHECK(kiln::default_kind("checkpointing") == kiln::defaults::checkpointing::kind);
    CHECK(kiln::default_kind("sharding") == kiln::defaults::sharding::kind);
    CHECK(kiln::default_kind("profiler") == kiln::defaults::profiler::kind);
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

  TEST_CASE("an accelerator built in C++ refuses what a recipe would, in the recipe's words") {
    using acc_t = kiln::accelerator<kiln::optim::adamw>;
    acc_t::settings s;
    s.optimizer.lr = -1;
    s.scheduler.kind = "consant";
    s.clip_grad_norm = -0.5;
    std::string message;
    try {
      acc_t acc(s);
    } catch (const kiln::config_error& e) {
      message = e.what();
    }
    CHECK(message ==
          "optimizer.lr = -1: expected a value > 0\n"
          "scheduler.kind = 'consant': expected one of \"constant\", \"linear\", \"cosine\" (did you mean \"constant\"?)\n"
          "train.clip_grad_norm = -0.5: expected a value >= 0");
    // The same value in a recipe: the same words after the recipe's file:line.
    const auto recipe = std::filesystem::temp_directory_path() / ("kiln-cxx-check-" + std::to_string(::getpid()) + ".toml");
    std::ofstream(recipe) << "[recipe]\nname = \"x\"\n[model]\nkind = \"mlp\"\n[optimizer]\nkind = \"adamw\"\nlr = -1\n";
    std::string recipe_message;
    try {
      kiln::optim::adamw::settings read;
      kiln::load_recipe(recipe).read_axis("optimizer", read);
    } catch (const kiln::config_error& e) {
      recipe_message = e.what();
    }
    std::filesystem::remove(recipe);
    CHECK_MESSAGE(recipe_message.find(": optimizer.lr = -1: expected a value > 0") != std::string::npos, recipe_message);
  }
}
