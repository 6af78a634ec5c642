// kiln/recipe/recipe.hpp: a training scenario read from one TOML file.
//
// A recipe picks the model, the data, the training length and one policy per axis, each with
// its settings. Every table is read strictly through the settings structs' describe() lists
// (kiln/settings/fields.hpp): an unknown table or key, a wrong type or a value out of range
// stops with the file, the line, the key and what was expected. `--set table.key=value`
// overrides apply before reading, and errors about them name the override instead of a line.
#pragma once

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "kiln/device.hpp"
#include "kiln/diagnostics.hpp"
#include "kiln/errors.hpp"
#include "kiln/models/cnn.hpp"
#include "kiln/models/gpt.hpp"
#include "kiln/models/mlp.hpp"
#include "kiln/settings/fields.hpp"
#include "kiln/recipe/kind_reader.hpp"
#include "kiln/recipe/kinds.hpp"
#include "kiln/recipe/toml_visitors.hpp"
#include "kiln/schedule.hpp"

namespace kiln {

struct recipe_info {
  std::string name;
  std::string description;
  std::string scenario;
  template <class V>
  void describe(V& v) {
    v.field("name", name, "short name; the default run directory is runs/<name>", checks::not_empty);
    v.field("description", description, "one line on what the recipe shows");
    v.field("scenario", scenario, "the training scenario it stands for");
  }
};

struct model_settings {
  std::string kind = "mlp";
  models::mlp_settings mlp;
  models::cnn_settings cnn;
  models::gpt_settings gpt;
  template <class V>
  void describe(V& v) {
    v.field("kind", kind, "mlp, cnn or gpt", checks::one_of({"mlp", "cnn", "gpt"}));
    // The remaining keys are the chosen model's own.
    if (kind == "mlp") mlp.describe(v);
    if (kind == "cnn") cnn.describe(v);
    if (kind == "gpt") gpt.describe(v);
  }
};

struct data_settings {
  std::string kind = "fashion-mnist";
  std::string path;  // empty: the kind's default
  double eval_fraction = 0.05;
  std::int64_t batch_size = 64;
  std::int64_t eval_batch_size = 1000;
  bool shuffle = true;
  double delay_ms = 0;
  std::int64_t workers = 0;
  std::int64_t prefetch = 2;
  // augmentation of training images (fashion-mnist)
  std::int64_t crop_padding = 0;
  double flip = 0.0;
  // synthetic data sets
  std::int64_t samples = 4096;
  std::int64_t eval_samples = 1024;
  std::int64_t features = 32;
  std::int64_t classes = 4;
  std::int64_t seq_len = 64;
  std::int64_t vocab_size = 64;
  std::int64_t min_len = 0;  // synthetic-tokens: 0 = every sequence seq_len long

  template <class V>
  void describe(V& v) {
    v.field("kind", kind, "fashion-mnist, text, synthetic-classification or synthetic-tokens",
            checks::one_of({"fashion-mnist", "text", "synthetic-classification", "synthetic-tokens"}));
    if (kind == "fashion-mnist") {
      if (path.empty()) path = "/usr/share/datasets/fashion-mnist";
      v.field("path", path, "folder with the *-ubyte.gz files", checks::not_empty);
    }
    if (kind == "text") {
      if (path.empty()) path = "/usr/share/games/fortunes";
      v.field("path", path, "a text file, or a folder of them read recursively (byte tokens)", checks::not_empty);
    }
    v.field("batch_size", batch_size, "samples per micro-batch", checks::positive);
    v.field("eval_batch_size", eval_batch_size, "samples per evaluation batch", checks::positive);
    v.field("shuffle", shuffle, "reshuffle the training set every epoch");
    v.field("delay_ms", delay_ms, "simulated input latency per batch, to see an input-bound profile",
            checks::non_negative);
    v.field("workers", workers, "threads making batches ahead of the training step (0: made in the step)",
            checks::non_negative);
    v.field("prefetch", prefetch, "batches made ahead of the one being trained on (at least workers)",
            checks::positive);
    if (kind == "fashion-mnist") {
      v.field("crop_padding", crop_padding,
              "augmentation: shift each training image by up to this many pixels (zero padding; 0: off)",
              checks::non_negative);
      v.field("flip", flip, "augmentation: probability of mirroring each training image left to right",
              checks::in_range(0.0, 1.0));
      return;
    }
    if (kind == "text") {
      v.field("seq_len", seq_len, "tokens per packed sequence", checks::positive);
      v.field("eval_fraction", eval_fraction, "share of the token stream held out for evaluation (its tail)",
              checks::in_range(0.001, 0.5));
      return;
    }
    v.field("samples", samples, "training samples to generate", checks::positive);
    v.field("eval_samples", eval_samples, "evaluation samples to generate", checks::positive);
    if (kind == "synthetic-classification") {
      v.field("features", features, "input features per sample", checks::positive);
      v.field("classes", classes, "number of classes", checks::positive);
    } else {
      v.field("seq_len", seq_len, "tokens per sequence", checks::positive);
      v.field("vocab_size", vocab_size, "distinct tokens", checks::positive);
      v.field("min_len", min_len,
              "variable-length sequences: each is from min_len to seq_len tokens long, padded to seq_len with "
              "targets the loss ignores (0: all seq_len long)",
              checks::non_negative);
    }
  }
};

struct train_settings {
  std::int64_t steps = 0;   // optimizer steps; 0 = derived from epochs
  std::int64_t epochs = 1;  // used when steps = 0
  std::int64_t seed = 0;
  std::int64_t threads = 0;  // 0 = every core
  std::string device = "auto";
  double clip_grad_norm = 0.0;
  std::int64_t log_every = 50;
  std::int64_t eval_every = 0;  // optimizer steps; 0 = at the end of every epoch
  template <class V>
  void describe(V& v) {
    v.field("steps", steps, "optimizer steps to train (0: use epochs)", checks::non_negative);
    v.field("epochs", epochs, "passes over the training set, when steps = 0", checks::positive);
    v.field("seed", seed, "seed of weights, shuffling and dropout", checks::non_negative);
    v.field("threads", threads,
            "threads of LibTorch and OpenBLAS (0: the cores no other process is running on, re-checked as the run goes)",
            checks::non_negative);
    v.field("device", device, "where the model trains: auto (this rank's GPU if there is one), cpu, cuda or cuda:N",
            [](const std::string& name) -> std::optional<std::string> {
              if (is_device_name(name)) return std::nullopt;
              return "expected " + std::string(device_forms);
            });
    v.field("clip_grad_norm", clip_grad_norm, "max global gradient norm (0: no clipping)", checks::non_negative);
    v.field("log_every", log_every, "optimizer steps between metric lines", checks::positive);
    v.field("eval_every", eval_every, "optimizer steps between evaluations (0: every epoch)", checks::non_negative);
  }
};

struct run_settings {
  std::string dir;  // empty = runs/<recipe name>
  std::int64_t save_every = 0;
  std::string resume = "auto";
  template <class V>
  void describe(V& v) {
    v.field("dir", dir, "run directory (default runs/<recipe name>)");
    v.field("save_every", save_every, "optimizer steps between saved states (0: only at the end)",
            checks::non_negative);
    v.field("resume", resume, "auto: continue an unfinished run in dir; never: start afresh",
            checks::one_of({"auto", "never"}));
  }
};

struct recipe {
  std::filesystem::path file;
  recipe_info info;
  model_settings model;
  data_settings data;
  train_settings train;
  schedule_settings scheduler;
  run_settings run;
  diagnostics_settings diagnostics;
  combination_kinds kinds;  // one per axis, in axis_names order
  // Per axis, the kinds `alternatives` lists: compiled in too, so --set AXIS.kind switches to them.
  std::array<std::vector<std::string>, axis_names.size()> alternatives;

  toml::table document;  // the file with overrides applied; axis tables are read from it
  detail::source_map sources;

  std::filesystem::path run_dir() const { return run.dir.empty() ? std::filesystem::path("runs") / info.name : std::filesystem::path(run.dir); }
  std::string combination() const { return combination_name(kinds); }

  // Reads the axis table into a policy's settings (everything but `kind` and `alternatives`), strictly.
  template <class Settings>
  void read_axis(std::string_view axis, Settings& settings) const {
    const std::string name(axis);
    const toml::table* table = document[name].as_table();
    detail::toml_reader reader(table, name, sources, table ? table->source() : toml::source_region{});
    settings.describe(reader);
    reader.reject_unknown_keys({"kind", "alternatives"});
  }

  // The resolved recipe: every table with every value, defaults included, as TOML.
  template <class AxisWriter>
  std::string resolved(AxisWriter&& write_axes) const {
    std::ostringstream out;
    out << "# resolved from " << file.string() << "\n";
    auto section = [&](const char* table, auto settings) {
      out << "\n[" << table << "]\n";
      detail::toml_writer writer(out);
      settings.describe(writer);
    };
    section("recipe", info);
    section("model", model);
    section("data", data);
    section("train", train);
    section("scheduler", scheduler);
    section("run", run);
    section("diagnostics", diagnostics);
    write_axes(out);
    return out.str();
  }
};

namespace detail {

inline const std::set<std::string>& known_tables() {
  static const std::set<std::string> tables = {"recipe",        "model",     "data",      "train",
                                               "scheduler",     "run",       "diagnostics", "precision",
                                               "accumulation",  "checkpointing", "sharding", "optimizer",
                                               "profiler"};
  return tables;
}

template <class Settings>
void read_table(const recipe& r, const std::string& name, Settings& settings) {
  const toml::table* table = r.document[name].as_table();
  toml_reader reader(table, name, r.sources, table ? table->source() : toml::source_region{});
  settings.describe(reader);
  reader.reject_unknown_keys();
}

// "--set optimizer.lr=3e-4": the value is TOML when it parses as TOML, a string otherwise
// (so --set model.kind=cnn works without quotes).
inline void apply_override(recipe& r, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw config_error("--set " + assignment + ": expected table.key=value, e.g. --set optimizer.lr=3e-4");
  const std::string table = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  if (!known_tables().count(table)) {
    std::vector<std::string> names(known_tables().begin(), known_tables().end());
    throw config_error("--set " + assignment + ": unknown table [" + table + "]" + did_you_mean(table, names));
  }
  if (key.empty() || key.find('.') != std::string::npos)
    throw config_error("--set " + assignment + ": expected table.key=value with a plain key");
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};
  }
  if (!r.document.contains(table)) r.document.insert(table, toml::table{});
  auto* target = r.document[table].as_table();
  if (!target) throw config_error("--set " + assignment + ": [" + table + "] in the recipe is not a table");
  target->insert_or_assign(key, *parsed.get("v"));
  r.sources.overrides[table + "." + key] = "--set " + assignment;
}

}  // namespace detail

// Reads and validates a recipe. Axis tables are checked here for their `kind` only; their
// other keys are read by the policy that the kind selects (recipe::read_axis).
inline recipe load_recipe(const std::filesystem::path& file, const std::vector<std::string>& overrides = {}) {
  recipe r;
  r.file = file;
  r.sources.file = file.string();
  if (!std::filesystem::exists(file)) throw config_error(file.string() + ": no such recipe file");
  try {
    r.document = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw config_error(file.string() + ":" + std::to_string(e.source().begin.line) + ": invalid TOML: " +
                       std::string(e.description()));
  }
  for (const auto& assignment : overrides) detail::apply_override(r, assignment);

  std::vector<std::string> names(detail::known_tables().begin(), detail::known_tables().end());
  for (const auto& [key, node] : r.document) {
    const std::string k(key.str());
    if (!detail::known_tables().count(k))
      throw config_error(r.sources.where(k, key.source()) + ": unknown table [" + k + "]" +
                         detail::did_you_mean(k, names));
    if (!node.is_table())
      throw config_error(r.sources.where(k, key.source()) + ": " + k + " must be a table ([" + k + "]), got " +
                         detail::toml_type_name(node));
  }
  if (!r.document.contains("recipe"))
    throw config_error(file.string() + ": missing [recipe] table with at least name = \"...\"");

  detail::read_table(r, "recipe", r.info);
  detail::read_table(r, "model", r.model);
  detail::read_table(r, "data", r.data);
  detail::read_table(r, "train", r.train);
  detail::read_table(r, "scheduler", r.scheduler);
  detail::read_table(r, "run", r.run);
  detail::read_table(r, "diagnostics", r.diagnostics);

  auto axes = detail::read_axis_kinds(
      r.document, [&](const std::string& key, const toml::node& n) { return r.sources.where(key, n.source()); });
  r.kinds = std::move(axes.kinds);
  r.alternatives = std::move(axes.alternatives);
  return r;
}

}  // namespace kiln
