// Tests for kiln/recipe: strict reading of TOML recipes (unknown tables and keys, wrong types,
// values out of range, bad policy kinds, broken TOML, --set overrides), the defaults, the shipped
// recipes, and the resolved-recipe writer (its output must read back to the same text).
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <kiln/kiln.hpp>
#include <kiln/recipes.hpp>

// doctest comes after the LibTorch headers: Debian's LibTorch is built with glog, whose
// CHECK macros would otherwise replace doctest's CHECK without a word.
#include <doctest/doctest.h>

#include "../cli_process.hpp"
#include "../temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

using kiln::test::contains;
using kiln::test::temp_dir;

// The message of the config_error that `f` throws ("" when it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kiln::config_error& e) {
    return e.what();
  }
  return {};
}

// A minimal valid recipe head; tests append their own tables. 2 lines.
const std::string head = "[recipe]\nname = \"t\"\n";

using adamw_trainer = kiln::trainer<kiln::optim::adamw>;
using sgd_trainer = kiln::trainer<kiln::optim::sgd>;

// The resolved text, through the trainer of the recipe's optimizer (the other axes take defaults).
std::string resolved_text(const kiln::recipe& r) {
  return r.kinds[4] == "sgd" ? kiln::resolve_recipe<sgd_trainer>(r).first : kiln::resolve_recipe<adamw_trainer>(r).first;
}

// The resolved text without its first line ("# resolved from <file>"), which names the file.
std::string resolved_body(const kiln::recipe& r) {
  std::string text = resolved_text(r);
  REQUIRE(text.rfind("# resolved from ", 0) == 0);
  return text.substr(text.find('\n') + 1);
}

}  // namespace

TEST_SUITE("recipe") {

TEST_CASE("an unknown key in an axis table names file:line, the key and the closest known key") {
  temp_dir dir("unknown_key");
  // line 1-2: head, 3: blank, 4: [optimizer], 5: kind, 6: lrr
  auto file = dir.write("file.toml", head + "\n[optimizer]\nkind = \"adamw\"\nlrr = 3e-4\n");
  // Axis tables are checked for `kind` only when the recipe is loaded ...
  kiln::recipe r;
  REQUIRE_NOTHROW(r = kiln::load_recipe(file));
  CHECK(r.kinds[4] == "adamw");
  // ... and strictly by the policy that the kind selects.
  kiln::optim::adamw::settings s;
  CHECK_THROWS_WITH_AS(r.read_axis("optimizer", s), doctest::Contains("file.toml:6"), kiln::config_error);
  const auto message = error_of([&] { r.read_axis("optimizer", s); });
  CHECK(contains(message, "unknown key optimizer.lrr"));
  CHECK(contains(message, "did you mean \"lr\""));
  CHECK(contains(message, "[optimizer] accepts: lr, beta1, beta2, eps, weight_decay, amsgrad"));
  // The same recipe through the whole resolution path.
  CHECK_THROWS_WITH_AS(kiln::resolve_recipe<adamw_trainer>(r), doctest::Contains("unknown key optimizer.lrr"),
                       kiln::config_error);
}

TEST_CASE("an unknown key in a fixed table is rejected when loading") {
  temp_dir dir("unknown_fixed_key");
  auto file = dir.write("file.toml", head + "[train]\nsteps = 3\nstepz = 4\n");
  const auto message = error_of([&] { kiln::load_recipe(file); });
  CHECK(contains(message, "file.toml:5"));
  CHECK(contains(message, "unknown key train.stepz"));
  CHECK(contains(message, "did you mean \"steps\""));
}

TEST_CASE("an axis table with no keys but kind says so") {
  temp_dir dir("no_keys");
  auto file = dir.write("file.toml", head + "[precision]\nkind = \"fp32\"\nloss_scale = 2\n");
  auto r = kiln::load_recipe(file);
  CHECK_THROWS_WITH_AS(kiln::resolve_recipe<adamw_trainer>(r),
                       doctest::Contains("file.toml:5: unknown key precision.loss_scale; [precision] accepts: "),
                       kiln::config_error);
  // toml_reader::reject_unknown_keys has a message for a table without settings of its own,
  // "no keys besides kind"; read_axis passes `kind` as also-known, so the list is never empty
  // and the message reads "[precision] accepts: kind".
  const auto message = error_of([&] { kiln::resolve_recipe<adamw_trainer>(r); });
  CAPTURE(message);
  CHECK(contains(message, "[precision] accepts: no keys besides kind"));
}

TEST_CASE("an unknown table names its line and the closest known table") {
  temp_dir dir("unknown_table");
  auto file = dir.write("file.toml", head + "\n\n[trian]\nsteps = 3\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(file), doctest::Contains("file.toml:5"), kiln::config_error);
  const auto message = error_of([&] { kiln::load_recipe(file); });
  CHECK(contains(message, "unknown table [trian]"));
  CHECK(contains(message, "did you mean \"train\""));
}

TEST_CASE("a far-off unknown table gets no suggestion") {
  temp_dir dir("far_table");
  auto file = dir.write("file.toml", head + "[xyzzyplugh]\na = 1\n");
  const auto message = error_of([&] { kiln::load_recipe(file); });
  CHECK(contains(message, "unknown table [xyzzyplugh]"));
  CHECK_FALSE(contains(message, "did you mean"));
}

TEST_CASE("a top-level value where a table belongs is rejected") {
  temp_dir dir("not_a_table");
  auto file = dir.write("file.toml", "model = 3\n" + head);
  CHECK_THROWS_WITH_AS(kiln::load_recipe(file), doctest::Contains("file.toml:1: model must be a table"),
                       kiln::config_error);
}

TEST_CASE("a value of the wrong type names the key, the expected and the given type") {
  temp_dir dir("wrong_type");
  auto file = dir.write("file.toml", head + "[data]\nbatch_size = \"big\"\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(file),
                       doctest::Contains("file.toml:4: data.batch_size: expected an integer, got a string"),
                       kiln::config_error);

  SUBCASE("a float is no integer") {
    auto f = dir.write("f.toml", head + "[train]\nsteps = 2.5\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f), doctest::Contains("train.steps: expected an integer, got a float"),
                         kiln::config_error);
  }
  SUBCASE("an integer is a number") {
    auto f = dir.write("f.toml", head + "[optimizer]\nkind = \"adamw\"\nlr = 1\n");
    auto r = kiln::load_recipe(f);
    kiln::optim::adamw::settings s;
    r.read_axis("optimizer", s);
    CHECK(s.lr == 1.0);
  }
  SUBCASE("arrays are checked element by element") {
    auto f = dir.write("f.toml", head + "[model]\nhidden = [16, \"x\"]\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f),
                         doctest::Contains("model.hidden: expected an array of integers, got an array whose element 1 "
                                           "is a string ('x')"),
                         kiln::config_error);
  }
  SUBCASE("a boolean is no string") {
    auto f = dir.write("f.toml", head + "[data]\nshuffle = \"yes\"\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f), doctest::Contains("data.shuffle: expected a boolean"),
                         kiln::config_error);
  }
  SUBCASE("a kind that is no string") {
    auto f = dir.write("f.toml", head + "[optimizer]\nkind = 3\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f), doctest::Contains("f.toml:4: optimizer.kind: expected a string, got an integer"),
                         kiln::config_error);
  }
}

TEST_CASE("a value out of range names the value and the range") {
  temp_dir dir("range");
  SUBCASE("dropout") {
    auto f = dir.write("f.toml", head + "[model]\ndropout = 1.5\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f), doctest::Contains("f.toml:4: model.dropout = 1.5: expected a value"),
                         kiln::config_error);
    CHECK(contains(error_of([&] { kiln::load_recipe(f); }), "[0, 1)"));
  }
  SUBCASE("batch_size") {
    auto f = dir.write("f.toml", head + "[data]\nbatch_size = 0\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f), doctest::Contains("data.batch_size = 0: expected a value > 0"),
                         kiln::config_error);
  }
  SUBCASE("a policy setting") {
    auto f = dir.write("f.toml", head + "[optimizer]\nkind = \"sgd\"\nmomentum = 1.0\n");
    auto r = kiln::load_recipe(f);
    kiln::optim::sgd::settings s;
    CHECK_THROWS_WITH_AS(r.read_axis("optimizer", s),
                         doctest::Contains("f.toml:5: optimizer.momentum = 1.0: expected a value in [0, 1)"),
                         kiln::config_error);
  }
  SUBCASE("a string that is not one of the choices") {
    auto f = dir.write("f.toml", head + "[model]\nkind = \"resnet\"\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f), doctest::Contains("expected one of \"mlp\", \"cnn\", \"gpt\""),
                         kiln::config_error);
    auto message = error_of([&] { kiln::load_recipe(f); });
    CHECK_FALSE(contains(message, "did you mean"));  // "resnet" is no near miss
  }
  SUBCASE("a choice one letter off is suggested") {
    auto f = dir.write("f.toml", head + "[model]\nkind = \"gtp\"\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f),
                         doctest::Contains("model.kind = 'gtp': expected one of \"mlp\", \"cnn\", \"gpt\" (did you mean \"gpt\"?)"),
                         kiln::config_error);
  }
  SUBCASE("an empty recipe name") {
    auto f = dir.write("f.toml", "[recipe]\ndescription = \"no name\"\n");
    CHECK_THROWS_WITH_AS(kiln::load_recipe(f), doctest::Contains("recipe.name: expected a non-empty value"),
                         kiln::config_error);
  }
}

TEST_CASE("a policy kind that does not exist lists the kinds of its axis") {
  temp_dir dir("bad_kind");
  auto file = dir.write("file.toml", head + "[optimizer]\nkind = \"adam\"\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(file), doctest::Contains("file.toml:4: optimizer.kind = \"adam\""),
                       kiln::config_error);
  const auto message = error_of([&] { kiln::load_recipe(file); });
  CHECK(contains(message, "\"sgd\""));
  CHECK(contains(message, "\"adamw\""));
}

TEST_CASE("a list of profilers is read in one order and each wrong element is named") {
  temp_dir dir("profiler_list");
  auto listed = [&](const std::string& list) { return dir.write("p.toml", head + "[profiler]\nkind = " + list + "\n"); };
  CHECK(kiln::load_recipe(listed("[\"phases\", \"memory\", \"ops\"]")).kinds[5] == "ops+memory+phases");
  CHECK(kiln::load_recipe(listed("[\"memory\"]")).kinds[5] == "memory");
  const auto error_for = [&](const std::string& list) { return error_of([&] { kiln::load_recipe(listed(list)); }); };
  CHECK(contains(error_for("[\"ops\", 3]"),
                 "p.toml:4: profiler.kind: expected an array of strings, got an array whose element 1 is an integer (3)"));
  CHECK(contains(error_for("[\"ops\", \"none\"]"), "profiler.kind: \"none\" cannot be combined with other profilers"));
  CHECK(contains(error_for("[\"ops\", \"opps\"]"), "profiler.kind: \"opps\" is not a profiler (did you mean \"ops\"?); a list takes \"ops\", \"trace\", "
                 "\"memory\", \"phases\""));
  CHECK(contains(error_for("[\"ops\", \"ops\"]"), "profiler.kind: \"ops\" is listed twice"));
  CHECK(contains(error_for("[]"), "profiler.kind: an empty list; use kind = \"none\" for no profiler"));
}

TEST_CASE("an axis table's alternatives are kinds of its axis, checked with file:line, and no setting of the policy") {
  temp_dir dir("alternatives");
  auto good = dir.write("good.toml", head + "[precision]\nkind = \"bf16\"\nalternatives = [\"fp32\", \"fp16\"]\n"
                                           "[profiler]\nalternatives = [\"phases\", [\"memory\", \"ops\"]]\n");
  auto r = kiln::load_recipe(good);
  CHECK(r.kinds[0] == "bf16");
  CHECK(r.alternatives[0] == std::vector<std::string>{"fp32", "fp16"});
  CHECK(r.alternatives[5] == std::vector<std::string>{"phases", "ops+memory"});
  kiln::precision::bf16::settings bf16;
  CHECK_NOTHROW(r.read_axis("precision", bf16));  // the policy does not see it as a key of its own

  // lines 1-2: head, 3: [precision], 4: kind, 5-8: alternatives, its second element on line 7
  auto typo = dir.write("typo.toml", head + "[precision]\nkind = \"bf16\"\nalternatives = [\n  \"fp32\",\n  \"fp61\",\n]\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(typo), doctest::Contains("typo.toml:7: precision.alternatives = \"fp61\": expected one of"),
                       kiln::config_error);
  // Two swapped characters are one slip: "fp16" is suggested, not "fp32" (two replacements away).
  CHECK_THROWS_WITH_AS(kiln::load_recipe(typo), doctest::Contains("(did you mean \"fp16\"?)"), kiln::config_error);
  auto not_a_list = dir.write("list.toml", head + "[precision]\nalternatives = \"fp16\"\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(not_a_list),
                       doctest::Contains("list.toml:4: precision.alternatives: expected an array of kinds, got a string"),
                       kiln::config_error);
  auto twice = dir.write("twice.toml", head + "[optimizer]\nalternatives = [\"sgd\", \"sgd\"]\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(twice), doctest::Contains("optimizer.alternatives: \"sgd\" is listed twice"),
                       kiln::config_error);
}

TEST_CASE("invalid TOML names the file and the line") {
  temp_dir dir("syntax");
  auto file = dir.write("file.toml", head + "[train]\nsteps = \n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(file), doctest::Contains("file.toml:4: invalid TOML"), kiln::config_error);
}

TEST_CASE("a missing file says so") {
  temp_dir dir("missing");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(dir.path / "nope.toml"), doctest::Contains("nope.toml: no such recipe file"),
                       kiln::config_error);
}

TEST_CASE("a recipe without a [recipe] table is rejected") {
  temp_dir dir("no_recipe_table");
  auto file = dir.write("file.toml", "[train]\nsteps = 3\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(file), doctest::Contains("missing [recipe] table"), kiln::config_error);
}

TEST_CASE("--set overrides") {
  temp_dir dir("overrides");
  auto file = dir.write("recipe.toml", head + "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n[data]\nbatch_size = 32\n");

  SUBCASE("values are TOML") {
    auto r = kiln::load_recipe(file, {"optimizer.lr=3e-4", "data.batch_size=16", "data.shuffle=false",
                                      "model.hidden=[8, 4]"});
    kiln::optim::adamw::settings s;
    r.read_axis("optimizer", s);
    CHECK(s.lr == 3e-4);
    CHECK(r.data.batch_size == 16);
    CHECK(r.data.shuffle == false);
    CHECK(r.model.as<kiln::models::mlp_settings>().hidden == std::vector<std::int64_t>{8, 4});
  }
  SUBCASE("bare strings need no quotes, quoted ones work too") {
    auto r = kiln::load_recipe(file, {"model.kind=cnn", "recipe.description=\"quoted\"", "run.dir=/tmp/some where"});
    CHECK(r.model.kind == "cnn");
    CHECK(r.info.description == "quoted");
    CHECK(r.run.dir == "/tmp/some where");
    CHECK(r.run_dir() == fs::path("/tmp/some where"));
  }
  SUBCASE("a policy kind") {
    auto r = kiln::load_recipe(file, {"optimizer.kind=sgd"});
    CHECK(r.kinds[4] == "sgd");
    // lr = 1e-3 from the file now belongs to sgd's settings.
    kiln::optim::sgd::settings s;
    r.read_axis("optimizer", s);
    CHECK(s.lr == 1e-3);
  }
  SUBCASE("a table that the file lacks is created") {
    auto r = kiln::load_recipe(file, {"accumulation.steps=4", "train.steps=7"});
    CHECK(r.train.steps == 7);
    kiln::accumulation::steps::settings s;
    r.read_axis("accumulation", s);
    CHECK(s.steps == 4);
  }
  SUBCASE("later overrides win") {
    auto r = kiln::load_recipe(file, {"train.steps=7", "train.steps=9"});
    CHECK(r.train.steps == 9);
  }
  SUBCASE("an error in an override names the override, not a line") {
    const auto message = error_of([&] { kiln::load_recipe(file, {"data.batch_size=-1"}); });
    CHECK(contains(message, "--set data.batch_size=-1"));
    CHECK(contains(message, "expected a value > 0"));
    CHECK_FALSE(contains(message, "recipe.toml:"));
    CHECK_THROWS_WITH_AS(kiln::load_recipe(file, {"data.batch_size=-1"}),
                         doctest::Contains("--set data.batch_size=-1"), kiln::config_error);
  }
  SUBCASE("an error in an overridden axis key names the override") {
    auto r = kiln::load_recipe(file, {"optimizer.lr=fast"});
    kiln::optim::adamw::settings s;
    CHECK_THROWS_WITH_AS(r.read_axis("optimizer", s),
                         doctest::Contains("--set optimizer.lr=fast: optimizer.lr: expected a number, got a string"),
                         kiln::config_error);
  }
  SUBCASE("an unknown key by override names the override") {
    auto r = kiln::load_recipe(file, {"optimizer.lrr=1"});
    kiln::optim::adamw::settings s;
    CHECK_THROWS_WITH_AS(r.read_axis("optimizer", s), doctest::Contains("--set optimizer.lrr=1: unknown key optimizer.lrr"),
                         kiln::config_error);
  }
  SUBCASE("a bad kind by override") {
    CHECK_THROWS_WITH_AS(kiln::load_recipe(file, {"optimizer.kind=adam"}),
                         doctest::Contains("--set optimizer.kind=adam: optimizer.kind = \"adam\": expected one of \"sgd\", \"adamw\", "),
                         kiln::config_error);
    CHECK_THROWS_WITH_AS(kiln::load_recipe(file, {"optimizer.kind=adam"}), doctest::Contains("(did you mean \"adamw\"?)"),
                         kiln::config_error);
  }
  SUBCASE("an unknown table") {
    CHECK_THROWS_WITH_AS(kiln::load_recipe(file, {"nosuch.key=1"}), doctest::Contains("unknown table [nosuch]"),
                         kiln::config_error);
    CHECK_THROWS_WITH_AS(kiln::load_recipe(file, {"optimiser.lr=1"}),
                         doctest::Contains("--set optimiser.lr=1: unknown table [optimiser] (did you mean \"optimizer\"?)"),
                         kiln::config_error);
  }
  SUBCASE("malformed assignments") {
    for (const std::string bad : {"optimizer.lr", "lr=3", "=3", "optimizer.=3", "optimizer.a.b=3"})
      CHECK_THROWS_WITH_AS(kiln::load_recipe(file, {bad}), doctest::Contains("expected table.key=value"),
                           kiln::config_error);
  }
}

TEST_CASE("defaults fill what the recipe leaves out") {
  temp_dir dir("defaults");
  auto file = dir.write("min.toml", head);
  auto r = kiln::load_recipe(file);
  CHECK(r.info.name == "t");
  CHECK(r.info.description.empty());
  CHECK(r.model.kind == "mlp");
  const auto& mlp = r.model.as<kiln::models::mlp_settings>();
  CHECK(mlp.in_features == 784);
  CHECK(mlp.hidden == std::vector<std::int64_t>{256, 256});
  CHECK(mlp.classes == 10);
  CHECK_THROWS_AS(r.model.as<kiln::models::gpt_settings>(), kiln::config_error);
  CHECK(r.data.kind == "fashion-mnist");
  CHECK(r.data.batch_size == 64);
  CHECK(r.data.eval_batch_size == 1000);
  CHECK(r.data.shuffle);
  CHECK(r.train.steps == 0);
  CHECK(r.train.epochs == 1);
  CHECK(r.train.log_every == 50);
  CHECK(r.scheduler.kind == "constant");
  CHECK(r.run.resume == kiln::resume_policy::automatic);
  CHECK(r.run_dir() == fs::path("runs") / "t");
  for (std::size_t i = 0; i < kiln::axis_names.size(); ++i)
    CHECK(r.kinds[i] == std::string(kiln::default_kind(kiln::axis_names[i])));
  CHECK(r.combination() ==
        "precision=fp32 accumulation=steps checkpointing=none sharding=single optimizer=sgd profiler=none");

  // Axis settings keep their defaults, with or without a table.
  kiln::optim::sgd::settings sgd;
  r.read_axis("optimizer", sgd);
  CHECK(sgd.lr == 0.1);
  CHECK(sgd.momentum == 0.9);
  auto r2 = kiln::load_recipe(dir.write("adamw.toml", head + "[optimizer]\nkind = \"adamw\"\nbeta1 = 0.8\n"));
  kiln::optim::adamw::settings adamw;
  r2.read_axis("optimizer", adamw);
  CHECK(adamw.lr == 1e-3);
  CHECK(adamw.beta1 == 0.8);
  CHECK(adamw.beta2 == 0.999);
  CHECK(adamw.weight_decay == 0.01);
}

TEST_CASE("the synthetic data kinds accept their own keys only") {
  temp_dir dir("data_kinds");
  auto ok = dir.write("ok.toml", head + "[data]\nkind = \"synthetic-classification\"\nfeatures = 8\nclasses = 3\n");
  auto r = kiln::load_recipe(ok);
  CHECK(r.data.as<kiln::data::synthetic_classification_settings>().features == 8);
  CHECK(r.data.as<kiln::data::synthetic_classification_settings>().classes == 3);
  auto bad = dir.write("bad.toml", head + "[data]\nkind = \"synthetic-classification\"\nvocab_size = 8\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(bad), doctest::Contains("bad.toml:5: unknown key data.vocab_size"),
                       kiln::config_error);
  auto path = dir.write("path.toml", head + "[data]\nkind = \"synthetic-tokens\"\npath = \"/x\"\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(path), doctest::Contains("unknown key data.path"), kiln::config_error);
}

TEST_CASE("the shipped recipes load and their policy kinds resolve") {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KILN_SOURCE_DIR) / "recipes")) {
    if (entry.path().extension() != ".toml") continue;
    ++count;
    CAPTURE(entry.path().string());
    kiln::recipe r;
    REQUIRE_NOTHROW(r = kiln::load_recipe(entry.path()));
    CHECK(!r.info.name.empty());
    CHECK(!r.info.description.empty());
    CHECK(r.info.name == entry.path().stem().string());
    for (std::size_t i = 0; i < kiln::axis_names.size(); ++i)
      CHECK_NOTHROW(kiln::policy_type(kiln::axis_names[i], r.kinds[i]));
    // Every shipped recipe is compiled into the CLI and reads strictly through its policies' settings.
    const auto check = kiln::test::kiln_cli("check '" + entry.path().string() + "'");
    CHECK_MESSAGE(check.status == 0, check.output);
  }
  CHECK(count >= 2);
}

TEST_CASE("the resolved recipe reads back to the same resolved text") {
  temp_dir dir("round_trip");
  auto check_round_trip = [&](const fs::path& file, const std::vector<std::string>& overrides) {
    CAPTURE(file.string());
    auto r = kiln::load_recipe(file, overrides);
    const auto text = resolved_text(r);
    auto again_file = dir.write("again_" + file.filename().string(), text);
    kiln::recipe again;
    REQUIRE_NOTHROW(again = kiln::load_recipe(again_file));
    CHECK(again.kinds == r.kinds);
    const auto first = resolved_body(r);
    const auto second = resolved_body(again);
    CHECK(first == second);
    // And once more: a fixed point.
    auto third_file = dir.write("third_" + file.filename().string(), resolved_text(again));
    CHECK(resolved_body(kiln::load_recipe(third_file)) == first);
  };

  SUBCASE("quickstart") {
    check_round_trip(fs::path(KILN_SOURCE_DIR) / "recipes" / "quickstart.toml", {});
  }
  SUBCASE("cnn") {
    check_round_trip(fs::path(KILN_SOURCE_DIR) / "recipes" / "cnn.toml", {});
  }
  SUBCASE("overrides, awkward floats and empty arrays") {
    check_round_trip(fs::path(KILN_SOURCE_DIR) / "recipes" / "quickstart.toml",
                     {"optimizer.lr=3e-4", "optimizer.eps=1e-300", "optimizer.weight_decay=0.30000000000000004",
                      "train.clip_grad_norm=1.5e10", "model.hidden=[]", "train.seed=9007199254740993"});
  }
  SUBCASE("strings that need escaping") {
    auto file = dir.write("strings.toml",
                          "[recipe]\n"
                          "name = \"it's\"\n"
                          "description = 'say \"hi\" \\ back\\slash'\n"
                          "scenario = \"tab\\there, unicode \\u00e9, newline\\nend\"\n"
                          "[run]\n"
                          "dir = \"C:\\\\runs\\\\x\"\n"
                          "[optimizer]\n"
                          "kind = \"adamw\"\n");
    auto r = kiln::load_recipe(file);
    CHECK(r.info.name == "it's");
    CHECK(r.info.description == "say \"hi\" \\ back\\slash");
    CHECK(r.info.scenario == "tab\there, unicode \u00e9, newline\nend");
    CHECK(r.run.dir == "C:\\runs\\x");
    check_round_trip(file, {});
  }
  SUBCASE("other model and data kinds") {
    auto file = dir.write("gpt.toml", head + "[model]\nkind = \"gpt\"\n[data]\nkind = \"synthetic-tokens\"\n"
                                             "[optimizer]\nkind = \"sgd\"\nnesterov = true\n[accumulation]\nsteps = 2\n");
    check_round_trip(file, {});
  }
}

TEST_CASE("the resolved recipe holds every table with every value") {
  auto r = kiln::load_recipe(fs::path(KILN_SOURCE_DIR) / "recipes" / "quickstart.toml", {"optimizer.lr=3e-4"});
  const auto [text, fingerprint] = kiln::resolve_recipe<adamw_trainer>(r);
  for (const char* table : {"[recipe]", "[model]", "[data]", "[train]", "[scheduler]", "[run]", "[precision]",
                            "[accumulation]", "[checkpointing]", "[sharding]", "[optimizer]", "[profiler]"})
    CHECK(contains(text, std::string("\n") + table + "\n"));
  CHECK(contains(text, "\nlr = 0.0003 "));
  CHECK(contains(text, "\nbeta2 = 0.999 "));
  CHECK(contains(text, "kind = \"adamw\""));
  // The fingerprint covers what a resumed run must share: model, data and policies, not the step count.
  CHECK(contains(fingerprint, "[model]"));
  CHECK(contains(fingerprint, "[optimizer]"));
  CHECK_FALSE(contains(fingerprint, "[train]"));
  auto longer = kiln::load_recipe(fs::path(KILN_SOURCE_DIR) / "recipes" / "quickstart.toml",
                                  {"optimizer.lr=3e-4", "train.steps=999"});
  CHECK(kiln::resolve_recipe<adamw_trainer>(longer).second == fingerprint);
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

TEST_CASE("an accelerator built in C++ refuses what a recipe would, in the recipe's words") {
  using acc_t = kiln::accelerator<kiln::optim::adamw>;
  acc_t::settings s;
  s.optimizer.lr = -1;
  s.scheduler = kiln::schedules::cosine{.min_factor = 2};
  s.clip_grad_norm = -0.5;
  std::string message;
  try {
    acc_t acc(s);
  } catch (const kiln::config_error& e) {
    message = e.what();
  }
  CHECK(message ==
        "optimizer.lr = -1: expected a value > 0\n"
        "scheduler.min_factor = 2: expected a value in [0, 1]\n"
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

TEST_CASE("an enum-like setting: a name in a recipe, an enum in C++, refused alike when it is none of them") {
  kiln::test::temp_dir dir("enum_setting");
  using kiln::accumulation::partial_window;
  kiln::accumulation::steps::settings read;
  kiln::load_recipe(dir.write("drop.toml", "[recipe]\nname = \"t\"\n[accumulation]\nepoch_end = \"drop\"\n"))
      .read_axis("accumulation", read);
  CHECK(read.epoch_end == partial_window::drop);
  CHECK_THROWS_WITH_AS(
      kiln::load_recipe(dir.write("typo.toml", "[recipe]\nname = \"t\"\n[accumulation]\nepoch_end = \"dorp\"\n"))
          .read_axis("accumulation", read),
      doctest::Contains("typo.toml:4: accumulation.epoch_end = 'dorp': expected one of \"step\", \"drop\" (did you mean \"drop\"?)"),
      kiln::config_error);
  CHECK_THROWS_WITH_AS(
      kiln::load_recipe(dir.write("number.toml", "[recipe]\nname = \"t\"\n[accumulation]\nepoch_end = 1\n"))
          .read_axis("accumulation", read),
      doctest::Contains("accumulation.epoch_end: expected one of \"step\", \"drop\", got an integer (1)"), kiln::config_error);
  // In C++: a value no name stands for is refused in the same words.
  kiln::accelerator<kiln::optim::sgd>::settings s;
  s.accumulation.epoch_end = static_cast<partial_window>(7);
  CHECK_THROWS_WITH_AS(kiln::accelerator<kiln::optim::sgd>{s},
                       "accumulation.epoch_end = 7: expected one of \"step\", \"drop\"", kiln::config_error);
  // Written back by name (the resolved recipe, `kiln check`).
  std::ostringstream text;
  kiln::detail::toml_writer writer(text);
  kiln::accumulation::steps::settings written{.epoch_end = partial_window::drop};
  written.describe(writer);
  CHECK_MESSAGE(contains(text.str(), "epoch_end = 'drop'"), text.str());
  CHECK(contains(text.str(), "normalize = 'mean'"));
}

TEST_CASE("a recipe's [train] device is checked when it loads, with file:line") {
  kiln::test::temp_dir dir("device_recipe");
  auto file = dir.write("f.toml", "[recipe]\nname = \"t\"\n[train]\ndevice = \"gpu\"\n");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(file), doctest::Contains("f.toml:4: train.device = 'gpu': expected"),
                       kiln::config_error);
  auto fine = dir.write("g.toml", "[recipe]\nname = \"t\"\n[train]\ndevice = \"cuda:1\"\n");
  CHECK(kiln::load_recipe(fine).train.device == "cuda:1");  // resolved when the run starts
}

}  // TEST_SUITE("recipe")

TEST_CASE("a resolved recipe with combined profilers reads back as the same combination") {
  temp_dir dir("profiler_round_trip");
  const auto file = fs::path(KILN_SOURCE_DIR) / "recipes" / "profiling.toml";
  auto r = kiln::load_recipe(file);
  using trainer_t = kiln::trainer<kiln::optim::adamw, kiln::profiler::profile<kiln::profiler::ops_collector,
                    kiln::profiler::trace_collector, kiln::profiler::memory_collector, kiln::profiler::phases_collector>>;
  const auto text = kiln::resolve_recipe<trainer_t>(r).first;
  CHECK(contains(text, "kind = [\"ops\", \"trace\", \"memory\", \"phases\"]"));
  auto again = kiln::load_recipe(dir.write("resolved.toml", text));
  CHECK(again.kinds == r.kinds);
}

TEST_CASE("[scheduler]: a registered kind with its own keys, checked like any other, reaching the accelerator") {
  temp_dir dir("scheduler");
  auto r = kiln::load_recipe(dir.write("cos.toml", head + "[scheduler]\nkind = \"cosine\"\nwarmup_steps = 3\nmin_factor = 0.1\n"));
  CHECK(r.scheduler.kind == "cosine");
  const auto settings = kiln::read_policy_settings<adamw_trainer>(r);
  REQUIRE(settings.scheduler.get_if<kiln::schedules::cosine>() != nullptr);
  CHECK(settings.scheduler.get_if<kiln::schedules::cosine>()->min_factor == 0.1);
  CHECK(settings.scheduler.factor(0, 100) == doctest::Approx(0.25));
  const auto resolved = resolved_body(r);
  CHECK(contains(resolved, "\n[scheduler]\nkind = 'cosine' "));
  CHECK(contains(resolved, "\nwarmup_steps = 3 "));
  CHECK(contains(resolved, "\nmin_factor = 0.1 "));

  const auto typo = error_of([&] { kiln::load_recipe(dir.write("typo.toml", head + "[scheduler]\nkind = \"consant\"\n")); });
  CHECK_MESSAGE(contains(typo, "typo.toml:4: scheduler.kind = 'consant': expected one of \"constant\", \"linear\", \"cosine\""), typo);
  CHECK_MESSAGE(contains(typo, "(did you mean \"constant\"?)"), typo);
  // constant has no min_factor: the key is unknown for that kind, not silently ignored
  const auto key = error_of([&] { kiln::load_recipe(dir.write("key.toml", head + "[scheduler]\nmin_factor = 0.1\n")); });
  CHECK_MESSAGE(contains(key, "key.toml:4"), key);
  CHECK_MESSAGE(contains(key, "min_factor"), key);
}

TEST_CASE("[loss]: auto follows the data's targets, a kind is checked like any other, and the CLI trains regression") {
  temp_dir dir("loss");
  auto r = kiln::load_recipe(dir.write("auto.toml", head));
  CHECK(r.loss.kind == "auto");
  CHECK(r.loss.resolved_kind(kiln::data::targets::classes) == "cross-entropy");
  CHECK(r.loss.resolved_kind(kiln::data::targets::tokens) == "next-token");
  CHECK(r.loss.resolved_kind(kiln::data::targets::values) == "mse");
  auto l1 = kiln::load_recipe(dir.write("l1.toml", head + "[loss]\nkind = \"l1\"\n"));
  CHECK(l1.loss.resolved_kind(kiln::data::targets::values) == "l1");
  CHECK_THROWS_WITH_AS(kiln::load_recipe(dir.write("typo.toml", head + "[loss]\nkind = \"mes\"\n")),
                       doctest::Contains("typo.toml:4: loss.kind = 'mes': expected \"auto\" or one of"), kiln::config_error);
  CHECK_THROWS_WITH_AS(kiln::load_recipe(dir.write("typo2.toml", head + "[loss]\nkind = \"mes\"\n")),
                       doctest::Contains("did you mean \"mse\""), kiln::config_error);

  const auto run = kiln::test::kiln_cli("run '" + std::string(KILN_SOURCE_DIR) +
                                        "/recipes/regression.toml' --no-progress --set train.steps=300 --set run.dir=" +
                                        (dir.path / "run").string());
  CAPTURE(run.output);
  REQUIRE(run.status == 0);
  CHECK(run.output.find("| loss mse |") != std::string::npos);
  CHECK(run.output.find(", mae ") != std::string::npos);
  CHECK(run.output.find(", rmse ") != std::string::npos);
}
