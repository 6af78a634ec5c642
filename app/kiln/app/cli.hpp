// kiln/app/cli.hpp (the application, not the library: cmake/kiln.cmake adds app/ to the
// include path of recipe executables only): the `kiln` command line, over a catalog of compiled policy combinations.
//
// A recipe chooses policy types, so the binary that runs it must contain that combination.
// The build generates the catalog from recipes (cmake: kiln_add_recipe_executable), and
// every such executable is a full kiln CLI for its recipes:
//   kiln run RECIPE [--set table.key=value]...   train
//   kiln check RECIPE [--set ...]                print the resolved recipe and its combination
//   kiln list                                    recipes and compiled combinations
//   kiln runs [DIR]                              run directories side by side
//   kiln profile RECIPE [--set ...]              a short session with every profiler, report in the run dir
//   kiln launch -n N RECIPE [--set ...]          N local ranks of a distributed recipe (torchrun's environment)
//   kiln doctor                                  LibTorch, threads, BLAS, Gloo/CUDA, datasets
#pragma once

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "kiln/app/doctor.hpp"
#include "kiln/recipes.hpp"
#include "kiln/app/launch.hpp"

namespace kiln::cli {

struct compiled_combination {
  combination_kinds kinds;
  std::vector<std::string> recipes;  // the recipes this combination was compiled for
  fit_summary (*run)(const recipe&, const run_request&);
  std::pair<std::string, std::string> (*resolve)(const recipe&);
};

template <class Trainer>
compiled_combination make_combination(combination_kinds kinds, std::vector<std::string> recipes) {
  return {std::move(kinds), std::move(recipes), &run_recipe<Trainer>, &resolve_recipe<Trainer>};
}

namespace detail {

// The combination compiled for the recipe's kinds; failing that, one with the same kinds on
// every other axis and more profilers (each combination has an every-profiler twin for `kiln
// profile`), which then runs only the recipe's (read_policy_settings sets profiler.only).
inline const compiled_combination& find_combination(const recipe& r, const std::vector<compiled_combination>& catalog) {
  for (const auto& c : catalog)
    if (c.kinds == r.kinds) return c;
  for (const auto& c : catalog) {
    bool others_equal = true;
    for (std::size_t i = 0; i < c.kinds.size(); ++i)
      others_equal = others_equal && (i == profiler_axis || c.kinds[i] == r.kinds[i]);
    if (others_equal && profiler_kinds_within(r.kinds[profiler_axis], c.kinds[profiler_axis])) return c;
  }
  std::string text = r.file.string() + ": this kiln binary does not contain the policy combination\n  " +
                     r.combination() + "\nit contains:\n";
  for (const auto& c : catalog) text += "  " + combination_name(c.kinds) + "\n";
  text +=
      "A recipe's combination is compiled when the build sees the recipe: put it in kiln's recipes/ folder and rerun "
      "./kiln (the build regenerates the catalog), or in your own CMake project call "
      "kiln_add_recipe_executable(<target> RECIPES " +
      r.file.filename().string() + ").";
  throw config_error(text);
}

struct parsed_args {
  std::string command;
  std::string recipe;
  std::vector<std::string> overrides;
  bool progress = true;
  int ranks = 0;         // launch -n
  double grace_s = 30;   // launch --grace
};

inline int parse_count(const std::string& option, const std::string& value) {
  std::size_t used = 0;
  int n = -1;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
  }
  if (used != value.size() || n < 0) throw config_error(option + " " + value + ": expected a whole number >= 0");
  return n;
}

inline parsed_args parse(int argc, char** argv) {
  parsed_args a;
  if (argc > 1) a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) a.overrides.push_back(argv[++i]);
    else if (arg.rfind("--set=", 0) == 0) a.overrides.push_back(arg.substr(6));
    else if (arg == "--no-progress") a.progress = false;
    else if ((arg == "-n" || arg == "--nproc") && i + 1 < argc) a.ranks = parse_count(arg, argv[++i]);
    else if (arg == "--grace" && i + 1 < argc) a.grace_s = static_cast<double>(parse_count(arg, argv[++i]));
    else if (arg.rfind("--", 0) == 0) throw config_error("unknown option " + arg + " (see kiln help)");
    else if (a.recipe.empty()) a.recipe = arg;
    else throw config_error("unexpected argument " + arg + " (one recipe per command)");
  }
  return a;
}

inline void usage() {
  std::printf(
      "kiln: compose a LibTorch training run from policies and TOML recipes\n\n"
      "usage:\n"
      "  kiln run RECIPE [--set table.key=value]... [--no-progress]   train as the recipe says\n"
      "  kiln check RECIPE [--set table.key=value]...                 validate; print the resolved recipe\n"
      "  kiln list                                                    recipes and compiled policy combinations\n"
      "  kiln runs [DIR]                                              runs under DIR (default runs/) side by side\n"
      "  kiln profile RECIPE [--set table.key=value]...               a short profiled session: ops, phases, memory, trace\n"
      "  kiln launch -n N RECIPE [--set ...] [--grace S]               N local ranks of a ddp / local-sgd recipe\n"
      "  kiln doctor                                                  what this machine gives a run\n");
}

inline std::string read_description(const std::string& file) {
  try {
    auto r = load_recipe(file);
    return r.info.name + ": " + r.info.description;
  } catch (const error& e) {
    return std::string("(unreadable: ") + e.what() + ")";
  }
}

inline std::optional<double> json_field(const std::string& text, const std::string& key) {
  const auto at = text.find("\"" + key + "\": ");
  if (at == std::string::npos) return std::nullopt;
  try {
    return std::stod(text.substr(at + key.size() + 4));
  } catch (const std::exception&) {
    return std::nullopt;  // "null": not measured
  }
}

// `kiln runs`: every run directory under `root` side by side, so that a rerun with one policy
// changed reads as a comparison.
inline int list_runs(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(root)) throw config_error(root.string() + ": no such run folder (runs go to runs/<name>)");
  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(root))
    if (fs::exists(entry.path() / "recipe.toml")) dirs.push_back(entry.path());
  std::sort(dirs.begin(), dirs.end());
  std::printf("%-28s %-5s %-9s %-8s %-18s %-6s %7s %9s %9s  %s\n", "run", "model", "precision", "accum", "optimizer (lr)",
              "batch", "steps", "time", "eval acc", "status");
  for (const auto& dir : dirs) {
    toml::table recipe;
    try {
      recipe = toml::parse_file((dir / "recipe.toml").string());
    } catch (const toml::parse_error&) {
      continue;
    }
    auto text = [&](const char* table, const char* key) { return recipe[table][key].value_or(std::string("?")); };
    char optimizer[64];
    std::snprintf(optimizer, sizeof optimizer, "%s (%g)", text("optimizer", "kind").c_str(),
                  recipe["optimizer"]["lr"].value_or(0.0));
    const auto summary = fs::exists(dir / "summary.json") ? kiln::detail::read_text(dir / "summary.json") : "";
    auto steps = json_field(summary, "steps"), seconds = json_field(summary, "seconds"),
         accuracy = json_field(summary, "eval_accuracy");
    char time_text[32] = "-", acc_text[32] = "-", steps_text[32] = "-";
    if (steps) std::snprintf(steps_text, sizeof steps_text, "%.0f", *steps);
    if (seconds) std::snprintf(time_text, sizeof time_text, "%.1f s", *seconds);
    if (accuracy) std::snprintf(acc_text, sizeof acc_text, "%.2f%%", 100.0 * *accuracy);
    std::printf("%-28s %-5s %-9s %-8lld %-18s %-6lld %7s %9s %9s  %s\n", dir.string().c_str(), text("model", "kind").c_str(),
                text("precision", "kind").c_str(), (long long)recipe["accumulation"]["steps"].value_or(std::int64_t{1}),
                optimizer, (long long)recipe["data"]["batch_size"].value_or(std::int64_t{0}), steps_text, time_text,
                acc_text, summary.empty() ? "unfinished" : "finished");
  }
  if (dirs.empty()) std::printf("(no runs in %s yet: ./kiln run recipes/quickstart.toml)\n", root.c_str());
  return 0;
}

}  // namespace detail

inline int main(int argc, char** argv, const std::vector<compiled_combination>& catalog) {
  ensure_passive_openmp_wait(argv);  // threads.hpp: why
  keep_freed_step_memory();
  try {
    auto args = detail::parse(argc, argv);
    if (args.command.empty() || args.command == "help" || args.command == "--help" || args.command == "-h") {
      detail::usage();
      return args.command.empty() ? 2 : 0;
    }
    if (args.command == "list") {
      std::printf("recipes compiled into this binary:\n");
      std::set<std::string> listed;  // a recipe with alternatives has several combinations
      for (const auto& c : catalog)
        for (const auto& file : c.recipes)
          if (listed.insert(file).second) std::printf("  %-40s %s\n", file.c_str(), detail::read_description(file).c_str());
      std::printf("\npolicy combinations:\n");
      for (const auto& c : catalog)
        std::printf("  %s%s\n", combination_name(c.kinds).c_str(), c.recipes.empty() ? "   (for kiln profile, and recipes asking for fewer profilers)" : "");
      std::printf("\nkinds a recipe can name (registered; a policy kind runs where its combination is compiled):\n");
      auto kind_line = [](const std::string& table, const std::string& kind, const std::string& type) {
        std::printf("  %-40s %s\n", ("[" + table + "] " + kind).c_str(), type.c_str());
      };
      for (const auto& k : registered_policies()) kind_line(k.axis, k.kind, k.type);
      for (const auto& k : registered_models()) kind_line("model", k.kind, k.type);
      for (const auto& k : registered_datasets()) kind_line("data", k.kind, k.type);
      for (const auto& k : registered_losses()) kind_line("loss", k.kind, k.type);
      for (const auto& k : registered_schedules()) kind_line("scheduler", k.kind, k.type);
      return 0;
    }
    if (args.command == "runs") return detail::list_runs(args.recipe.empty() ? "runs" : args.recipe);
    if (args.command == "doctor") {
      at::set_num_threads(static_cast<int>(resolve_threads(0)));
      int warnings = 0;
      for (const auto& line : diagnose()) {
        std::printf("%-14s %s\n", line.topic.c_str(), line.value.c_str());
        if (!line.warning.empty()) std::printf("%-14s   warning: %s\n", "", line.warning.c_str()), ++warnings;
      }
      std::printf("%s\n", warnings ? "some warnings: see above" : "all good");
      return 0;
    }
    if (args.command == "profile") {
      // A short session of the recipe with every profiler: wait 1, warmup 2, active 5 steps,
      // unless the command line says otherwise.
      if (args.recipe.empty()) throw config_error("kiln profile: which recipe? e.g. kiln profile recipes/profiling.toml");
      auto r = load_recipe(args.recipe, args.overrides);
      std::string every_collector;
      for_each_collector_kind(profile_all_kind(), [&](std::string_view kind) {
        every_collector += (every_collector.empty() ? "\"" : ", \"") + std::string(kind) + "\"";
      });
      std::vector<std::string> overrides = {"profiler.kind=[" + every_collector + "]", "run.resume=never"};
      const auto* profiler_table = r.document["profiler"].as_table();
      std::int64_t cycle = 0;
      for (auto [key, fallback] : {std::pair{"wait", 1}, {"warmup", 2}, {"active", 5}}) {
        auto value = profiler_table ? (*profiler_table)[key].value<std::int64_t>() : std::nullopt;
        if (!value) overrides.push_back(std::string("profiler.") + key + "=" + std::to_string(fallback));
        cycle += value.value_or(fallback);
      }
      overrides.push_back("profiler.repeat=1");
      // One step after the profiled ones checks gradient health, so its hooks do not skew the profile.
      if (!r.sources.overrides.count("train.steps")) overrides.push_back("train.steps=" + std::to_string(cycle + 1));
      if (!r.sources.overrides.count("diagnostics.every"))
        overrides.push_back("diagnostics.every=" + std::to_string(cycle + 1));
      if (!r.sources.overrides.count("run.dir"))
        overrides.push_back("run.dir=" + (r.run_dir().string() + "-profile"));
      overrides.insert(overrides.begin(), args.overrides.begin(), args.overrides.end());
      auto profiled = load_recipe(args.recipe, overrides);
      const auto& combination = detail::find_combination(profiled, catalog);
      combination.run(profiled, {.progress = args.progress});
      std::printf("profile of %s written to %s\n", r.info.name.c_str(), (profiled.run_dir() / "profile").c_str());
      return 0;
    }
    if (args.command == "launch") {
      if (args.recipe.empty() || args.ranks < 1)
        throw config_error("kiln launch: usage: kiln launch -n N RECIPE [--set table.key=value]...");
      auto r = load_recipe(args.recipe, args.overrides);  // a recipe's mistakes show once, not N times
      detail::find_combination(r, catalog);
      launch_options o{.ranks = args.ranks, .rank_args = {"run", args.recipe}, .grace_s = args.grace_s};
      for (const auto& s : args.overrides) o.rank_args.insert(o.rank_args.end(), {"--set", s});
      if (!args.progress) o.rank_args.push_back("--no-progress");
      return launch("/proc/self/exe", o);
    }
    if (args.command == "run" || args.command == "check") {
      if (args.recipe.empty()) throw config_error("kiln " + args.command + ": which recipe? e.g. kiln " +
                                                  args.command + " recipes/quickstart.toml");
      auto r = load_recipe(args.recipe, args.overrides);
      const auto& combination = detail::find_combination(r, catalog);
      if (args.command == "check") {
        auto [resolved, fingerprint] = combination.resolve(r);
        std::printf("%s\n# policy combination: %s (compiled in)\n", resolved.c_str(), r.combination().c_str());
        return 0;
      }
      auto summary = combination.run(r, {.progress = args.progress});
      if (const char* rank = std::getenv("RANK"); rank && std::string_view(rank) != "0") return 0;  // rank 0 reports
      std::printf("%s: %lld steps in %.1f s", r.info.name.c_str(), (long long)summary.steps, summary.seconds);
      if (summary.evaluated)
        std::printf(", eval loss %.4f%s", summary.final_eval.loss, summary.final_eval.metrics_text().c_str());
      std::printf("%s; run directory %s\n", summary.stopped_early ? " (stopped early)" : "", r.run_dir().c_str());
      return 0;
    }
    throw config_error("unknown command \"" + args.command + "\" (try: run, check, launch, profile, list, runs, doctor)");
  } catch (const kiln::error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "kiln: LibTorch error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace kiln::cli
