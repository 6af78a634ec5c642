// Tests for the kiln command line: the real CLI binary as a subprocess (list, check, run,
// doctor, errors), a short quickstart training run with its run directory, and the catalog
// lookup that reports a policy combination the binary does not contain.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <kiln/app/cli.hpp>

// doctest comes after the LibTorch headers: Debian's LibTorch is built with glog, whose
// CHECK macros would otherwise replace doctest's CHECK without a word.
#include <doctest/doctest.h>

#include "../cli_process.hpp"
#include "../temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

using kiln::test::contains;
using kiln::test::kiln_cli;
using kiln::test::temp_dir;

std::string read_file(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

}  // namespace

TEST_SUITE("cli") {

TEST_CASE("kiln list shows the compiled recipes and combinations") {
  auto r = kiln_cli("list");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "recipes/quickstart.toml"));
  CHECK(contains(r.output, "quickstart: MLP"));
  CHECK(contains(r.output, "recipes/cnn.toml"));
  CHECK(contains(r.output, "policy combinations:"));
  CHECK(contains(r.output,
                 "precision=fp32 accumulation=steps checkpointing=none sharding=single optimizer=adamw profiler=none"));
  CHECK(contains(r.output,
                 "precision=fp32 accumulation=steps checkpointing=none sharding=single optimizer=sgd profiler=none"));
  CHECK(!contains(r.output, "unreadable"));
}

TEST_CASE("a recipe's alternatives are compiled in: the mixed-precision recipe switches precision without a rebuild") {
  for (const std::string kind : {"fp32", "bf16", "bf16-pure", "fp16"}) {
    auto r = kiln_cli("check recipes/mixed-precision.toml --set precision.kind=" + kind);
    CAPTURE(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "precision=" + kind + " accumulation=steps checkpointing=none sharding=single optimizer=adamw "
                             "profiler=none (compiled in)"));
  }
  auto list = kiln_cli("list");
  CHECK(list.output.find("recipes/mixed-precision.toml") == list.output.rfind("recipes/mixed-precision.toml"));  // listed once

  // fp16 trains on the CPU only where LibTorch's CPU autocast has float16 (2.x); here it says why not
  temp_dir dir("fp16_cpu");
  auto r = kiln_cli("run recipes/mixed-precision.toml --set precision.kind=fp16 --set train.device=cpu --set train.steps=4 "
                    "--set train.eval_every=4 --set train.log_every=2 --no-progress --set run.dir=" + quoted(dir.path / "run"));
  CAPTURE(r.output);
  if (kiln::detail::cpu_half_autocast_failure().empty()) {
    CHECK(r.status == 0);
    CHECK(fs::exists(dir.path / "run" / "summary.json"));
  } else {
    CHECK(r.status != 0);
    CHECK(contains(r.output, "precision.kind = \"fp16\" cannot train on the CPU with this LibTorch"));
    CHECK(contains(r.output, kiln::detail::cpu_half_autocast_failure()));
  }
}

TEST_CASE("kiln check prints the resolved recipe and its combination") {
  SUBCASE("as it is") {
    auto r = kiln_cli("check recipes/quickstart.toml");
    CAPTURE(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "# resolved from recipes/quickstart.toml"));
    CHECK(contains(r.output, "\n[optimizer]\nkind = \"adamw\"\n"));
    CHECK(contains(r.output, "\nbeta1 = 0.9 "));  // a default the recipe leaves out
    CHECK(contains(r.output, "\nwarmup_steps = 100 "));
    CHECK(contains(r.output, "optimizer=adamw profiler=none (compiled in)"));
  }

  SUBCASE("with overrides") {
    auto o = kiln_cli("check recipes/quickstart.toml --set optimizer.kind=sgd --set optimizer.lr=0.05 --set=train.steps=7");
    CAPTURE(o.output);
    CHECK(o.status == 0);
    CHECK(contains(o.output, "\n[optimizer]\nkind = \"sgd\"\nlr = 0.05 "));
    CHECK(contains(o.output, "\nsteps = 7 "));
    CHECK(contains(o.output, "optimizer=sgd profiler=none (compiled in)"));
  }
}

TEST_CASE("the catalog lookup names a combination that is not compiled in") {
  temp_dir dir("catalog");
  auto file = dir.write("mine.toml", "[recipe]\nname = \"mine\"\n[optimizer]\nkind = \"adamw\"\n[accumulation]\nkind = \"steps\"\n");
  auto r = kiln::load_recipe(file);
  const kiln::combination_kinds sgd = {"fp32", "steps", "none", "single", "sgd", "none"};
  const kiln::combination_kinds adamw = {"fp32", "steps", "none", "single", "adamw", "none"};

  std::vector<kiln::cli::compiled_combination> only_sgd{{sgd, {"recipes/cnn.toml"}, nullptr, nullptr}};
  CHECK_THROWS_WITH_AS(kiln::cli::detail::find_combination(r, only_sgd),
                       doctest::Contains("mine.toml: this kiln binary does not contain the policy combination"),
                       kiln::config_error);
  std::string message;
  try {
    kiln::cli::detail::find_combination(r, only_sgd);
  } catch (const kiln::config_error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(contains(message, "\n  " + kiln::combination_name(adamw) + "\nit contains:\n  " + kiln::combination_name(sgd)));
  CHECK(contains(message, "kiln_add_recipe_executable(<target> RECIPES mine.toml)"));

  std::vector<kiln::cli::compiled_combination> both{{sgd, {}, nullptr, nullptr}, {adamw, {}, nullptr, nullptr}};
  CHECK(&kiln::cli::detail::find_combination(r, both) == &both[1]);

  std::vector<kiln::cli::compiled_combination> none;
  CHECK_THROWS_WITH_AS(kiln::cli::detail::find_combination(r, none), doctest::Contains("it contains:\nA recipe"),
                       kiln::config_error);
}

TEST_CASE("kiln run and check stop on a bad recipe with file:line") {
  temp_dir dir("bad_recipe");
  SUBCASE("an unknown key, in run and in check") {
    auto file = dir.write("bad.toml", "[recipe]\nname = \"bad\"\n[train]\nstesp = 3\n");
    for (const char* command : {"run", "check"}) {
      CAPTURE(command);
      auto r = kiln_cli(std::string(command) + " " + quoted(file) + " --no-progress");
      CAPTURE(r.output);
      CHECK(r.status == 1);
      CHECK(contains(r.output, "kiln: error: "));
      CHECK(contains(r.output, "bad.toml:4: unknown key train.stesp (did you mean \"steps\"?)"));
    }
  }

  SUBCASE("an error in a policy's table is found before training") {
    auto axis = dir.write("axis.toml", "[recipe]\nname = \"axis\"\n[optimizer]\nkind = \"adamw\"\nlrr = 1\n");
    auto r = kiln_cli("run " + quoted(axis) + " --set run.dir=" + quoted(dir.path / "never"));
    CAPTURE(r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "kiln: error: "));
    CHECK(contains(r.output, "axis.toml:5: unknown key optimizer.lrr"));
    CHECK(!fs::exists(dir.path / "never"));
  }
  SUBCASE("an override error names the override") {
    auto r = kiln_cli("check recipes/quickstart.toml --set data.batch_size=-1");
    CAPTURE(r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "kiln: error: --set data.batch_size=-1: data.batch_size = -1: expected a value > 0"));
  }
  SUBCASE("a dataset that is not there names the recipe line or the --set that pointed to it") {
    auto file = dir.write("data.toml", "[recipe]\nname = \"data\"\n[data]\nkind = \"fashion-mnist\"\n"
                                       "path = \"/nonexistent/fmnist\"\n");
    auto r = kiln_cli("run " + quoted(file) + " --no-progress --set run.dir=" + quoted(dir.path / "never"));
    CAPTURE(r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "data.toml:5: [data] kind = \"fashion-mnist\", path = \"/nonexistent/fmnist\": fashion-mnist: "));
    CHECK(!fs::exists(dir.path / "never"));
    auto set = kiln_cli("run recipes/gpt.toml --no-progress --set data.path=/nonexistent/corpus --set run.dir=" +
                        quoted(dir.path / "never"));
    CAPTURE(set.output);
    CHECK(set.status == 1);
    CHECK(contains(set.output, "kiln: error: --set data.path=/nonexistent/corpus: [data] kind = \"text\", path = "
                               "\"/nonexistent/corpus\": text corpus /nonexistent/corpus does not exist"));
  }
  SUBCASE("a missing recipe file") {
    auto r = kiln_cli("run " + quoted(dir.path / "nope.toml"));
    CAPTURE(r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "nope.toml: no such recipe file"));
  }
}

TEST_CASE("kiln rejects unknown commands, options and missing recipes") {
  auto unknown = kiln_cli("frobnicate");
  CAPTURE(unknown.output);
  CHECK(unknown.status != 0);
  CHECK(contains(unknown.output, "unknown command \"frobnicate\""));

  auto option = kiln_cli("check recipes/quickstart.toml --fast");
  CHECK(option.status == 1);
  CHECK(contains(option.output, "unknown option --fast"));

  auto two = kiln_cli("check recipes/quickstart.toml recipes/cnn.toml");
  CHECK(two.status == 1);
  CHECK(contains(two.output, "one recipe per command"));

  auto which = kiln_cli("run");
  CHECK(which.status == 1);
  CHECK(contains(which.output, "which recipe?"));

  auto bare = kiln_cli("");
  CHECK(bare.status == 2);
  CHECK(contains(bare.output, "usage:"));

  auto help = kiln_cli("help");
  CHECK(help.status == 0);
  CHECK(contains(help.output, "kiln run RECIPE"));
}

TEST_CASE("quickstart smoke run: metrics, state, summary, a finished run is kept as <dir>.1") {
  temp_dir dir("smoke");
  const auto run_dir = dir.path / "run";
  const std::string common = "run recipes/quickstart.toml --set train.log_every=20 --set run.dir=" + quoted(run_dir);

  auto first = kiln_cli(common + " --set train.steps=40 --no-progress");
  CAPTURE(first.output);
  REQUIRE(first.status == 0);
  CHECK(contains(first.output, "quickstart: 40 steps in"));
  CHECK(contains(first.output, "accuracy"));
  CHECK(contains(first.output, "optimizer=adamw"));
  // The evaluation result is a line that must stay (progress.hpp), even without the progress display.
  CHECK(contains(first.output, "eval @ step 40"));

  for (const char* name : {"recipe.toml", "metrics.jsonl", "state.pt", "summary.json"}) {
    CAPTURE(name);
    CHECK(fs::exists(run_dir / name));
  }
  const auto metrics = read_file(run_dir / "metrics.jsonl");
  CAPTURE(metrics);
  CHECK(contains(metrics, "\"step\": 20"));
  CHECK(contains(metrics, "\"step\": 40"));
  CHECK(contains(metrics, "eval_accuracy"));
  CHECK(contains(read_file(run_dir / "summary.json"), "\"steps\": 40"));
  const auto recipe_text = read_file(run_dir / "recipe.toml");
  CHECK(contains(recipe_text, "\nsteps = 40 "));
  CHECK(contains(recipe_text, "\n[optimizer]\nkind = \"adamw\"\n"));

  // The saved recipe.toml is itself a valid strict recipe.
  auto saved = kiln::load_recipe(run_dir / "recipe.toml");
  CHECK(saved.train.steps == 40);
  CHECK(saved.run.dir == run_dir.string());

  // A finished run is not resumed: it is moved aside and a new one starts. Without
  // --no-progress (stderr is no terminal here) the step and eval lines are printed.
  auto second = kiln_cli(common + " --set train.steps=60");
  CAPTURE(second.output);
  REQUIRE(second.status == 0);
  CHECK(contains(second.output, "moved"));
  CHECK(contains(second.output, (dir.path / "run.1").string()));
  CHECK(contains(second.output, "quickstart: 60 steps in"));
  CHECK(contains(second.output, "step 60/60"));
  CHECK(contains(second.output, "eval @ step 60"));
  CHECK(!contains(second.output, "resuming"));
  REQUIRE(fs::exists(dir.path / "run.1"));
  CHECK(contains(read_file(dir.path / "run.1" / "summary.json"), "\"steps\": 40"));
  CHECK(contains(read_file(run_dir / "summary.json"), "\"steps\": 60"));
  const auto metrics2 = read_file(run_dir / "metrics.jsonl");
  CHECK(metrics2.find("\"step\": 20") == metrics2.rfind("\"step\": 20"));  // a fresh log, not appended

  // An unfinished run (no summary.json) with the same recipe is resumed from its state.
  fs::remove(run_dir / "summary.json");
  auto third = kiln_cli(common + " --set train.steps=80 --no-progress");
  CAPTURE(third.output);
  REQUIRE(third.status == 0);
  CHECK(contains(third.output, "resuming"));
  CHECK(contains(third.output, "at step 60"));
  CHECK(!contains(third.output, "moved"));
  CHECK(!fs::exists(dir.path / "run.2"));
  CHECK(contains(read_file(run_dir / "summary.json"), "\"steps\": 80"));
}

TEST_CASE("kiln doctor reports the machine") {
  auto r = kiln_cli("doctor");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "LibTorch"));
  CHECK(contains(r.output, "BLAS"));
  CHECK(contains(r.output, "threads"));
  CHECK(contains(r.output, "busy cores"));
  // bf16: what this CPU's LibTorch GEMM is, measured, and what the bf16 recipes do about it
  CHECK(contains(r.output, "bf16 GEMM      LibTorch's"));
  CHECK(contains(r.output, kiln::precision::detail::cpu_has_onednn_bf16_gemm() ? "bf16 recipes   LibTorch's bf16 GEMM"
                                                                                 : "bf16 recipes   matmuls computed in fp32"));
}

}  // TEST_SUITE("cli")
