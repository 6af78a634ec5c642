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
#include <optional>
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
#include "kiln/recipe/builtin_kinds.hpp"
#include "kiln/recipe/kind_reader.hpp"
#include "kiln/recipe/registry.hpp"
#include "kiln/settings/any_settings.hpp"
#include "kiln/settings/fields.hpp"
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

namespace detail {

// The check of a [model] or [data] kind: one of the registered ones (kiln/recipe/registry.hpp).
template <class Entry>
auto registered_kind(const std::vector<Entry>& (*entries)()) {
  return [entries](const std::string& kind) -> std::optional<std::string> {
    if (find_kind(entries(), kind)) return std::nullopt;
    const auto names = kind_names(entries());
    return "expected one of " + quoted_list(names) + did_you_mean(kind, names);
  };
}

// Makes `own` hold the settings of `kind` (its defaults) unless it already does.
template <class Entry>
void hold_settings_of(any_settings& own, const std::string& kind, const std::vector<Entry>& entries) {
  if (own.kind() == kind) return;
  const auto* entry = find_kind(entries, kind);
  own = entry ? entry->make_settings() : any_settings{};
}

}  // namespace detail

// [model]: its kind, then the keys of that kind's settings struct (kiln/recipe/components.hpp).
struct model_settings {
  std::string kind = std::string(models::mlp_settings::kind);
  any_settings own;  // the settings of `kind`

  template <class V>
  void describe(V& v) {
    v.field("kind", kind, "the model; `kiln list` shows the kinds", detail::registered_kind(&registered_models));
    detail::hold_settings_of(own, kind, registered_models());
    own.describe(v);  // the remaining keys are the chosen model's own
  }
  // The chosen kind's settings, e.g. as<kiln::models::mlp_settings>(); throws if it is another kind.
  template <class Settings>
  const Settings& as() const {
    return own.get<Settings>();
  }
};

// [data]: its kind and that kind's own keys, then how batches are made from it.
struct data_settings {
  std::string kind = std::string(data::fashion_mnist_settings::kind);
  any_settings own;  // the settings of `kind`
  std::int64_t batch_size = 64;
  std::int64_t eval_batch_size = 1000;
  bool shuffle = true;
  double delay_ms = 0;
  std::int64_t workers = 0;
  std::int64_t prefetch = 2;
  // augmentation of training images (samples shaped [channels, height, width])
  std::int64_t crop_padding = 0;
  double flip = 0.0;

  template <class V>
  void describe(V& v) {
    v.field("kind", kind, "the dataset; `kiln list` shows the kinds", detail::registered_kind(&registered_datasets));
    detail::hold_settings_of(own, kind, registered_datasets());
    own.describe(v);
    v.field("batch_size", batch_size, "samples per micro-batch", checks::positive);
    v.field("eval_batch_size", eval_batch_size, "samples per evaluation batch", checks::positive);
    v.field("shuffle", shuffle, "reshuffle the training set every epoch");
    v.field("delay_ms", delay_ms, "simulated input latency per batch, to see an input-bound profile",
            checks::non_negative);
    v.field("workers", workers, "threads making batches ahead of the training step (0: made in the step)",
            checks::non_negative);
    v.field("prefetch", prefetch, "batches made ahead of the one being trained on (at least workers)",
            checks::positive);
    v.field("crop_padding", crop_padding,
            "augmentation of images: shift each training image by up to this many pixels (zero padding; 0: off)",
            checks::non_negative);
    v.field("flip", flip, "augmentation of images: probability of mirroring each training image left to right",
            checks::in_range(0.0, 1.0));
  }
  // The chosen kind's settings, e.g. as<kiln::data::text_settings>(); throws if it is another kind.
  template <class Settings>
  const Settings& as() const {
    return own.get<Settings>();
  }
};

// [loss]: what training minimises and evaluation reports (kiln/loss.hpp). "auto" follows the
// data's targets: cross-entropy for classes, next-token for token sequences, mse for values.
struct loss_settings {
  static constexpr std::string_view automatic = "auto";
  std::string kind = std::string(automatic);
  any_settings own;  // the settings of `kind` (none for auto)

  template <class V>
  void describe(V& v) {
    v.field("kind", kind, "the loss: auto (from the data's targets) or one of `kiln list`'s",
            [](const std::string& k) -> std::optional<std::string> {
              if (k == automatic || find_kind(registered_losses(), k)) return std::nullopt;
              auto names = kind_names(registered_losses());
              return "expected \"auto\" or one of " + detail::quoted_list(names) + detail::did_you_mean(k, names);
            });
    if (kind == automatic) own = {};
    else detail::hold_settings_of(own, kind, registered_losses());
    own.describe(v);
  }
  // The loss kind for data whose targets are `targets`, where kind is auto.
  std::string resolved_kind(data::targets targets) const {
    if (kind != automatic) return kind;
    switch (targets) {
      case data::targets::tokens: return std::string(losses::next_token::kind);
      case data::targets::values: return std::string(losses::mse::kind);
      case data::targets::classes: break;
    }
    return std::string(losses::cross_entropy::kind);
  }
};

// [scheduler]: the learning-rate schedule's kind and that kind's keys (kiln/schedule.hpp).
struct scheduler_settings {
  std::string kind = std::string(schedules::constant::kind);
  any_settings own;  // the settings of `kind`

  template <class V>
  void describe(V& v) {
    v.field("kind", kind, "the lr schedule; `kiln list` shows the kinds", detail::registered_kind(&registered_schedules));
    detail::hold_settings_of(own, kind, registered_schedules());
    own.describe(v);
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

// [run] resume: whether a run directory's unfinished run is continued.
enum class resume_policy { automatic, never };
constexpr auto choices(resume_policy) {
  return std::to_array<choice<resume_policy>>({{"auto", resume_policy::automatic}, {"never", resume_policy::never}});
}

struct run_settings {
  std::string dir;  // empty = runs/<recipe name>
  std::int64_t save_every = 0;
  resume_policy resume = resume_policy::automatic;
  template <class V>
  void describe(V& v) {
    v.field("dir", dir, "run directory (default runs/<recipe name>)");
    v.field("save_every", save_every, "optimizer steps between saved states (0: only at the end)",
            checks::non_negative);
    v.field("resume", resume, "auto: continue an unfinished run in dir; never: start afresh");
  }
};

struct recipe {
  std::filesystem::path file;
  recipe_info info;
  model_settings model;
  data_settings data;
  loss_settings loss;
  train_settings train;
  scheduler_settings scheduler;
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
    section("loss", loss);
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
#define KILN_DETAIL_AXIS_TABLE(axis_name, default_policy) #axis_name,
  static const std::set<std::string> tables = {"recipe", "model", "data",        "loss",
                                               "train",  "scheduler", "run", "diagnostics",
                                               KILN_AXES(KILN_DETAIL_AXIS_TABLE)};
#undef KILN_DETAIL_AXIS_TABLE
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
  detail::read_table(r, "loss", r.loss);
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
