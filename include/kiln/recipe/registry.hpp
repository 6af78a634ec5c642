// kiln/recipe/registry.hpp: the kinds a recipe can name, each registered by its C++ type.
//
// A recipe's `kind = "..."` on an axis table, in [model], [data], [loss] or [scheduler] is the
// `kind` member of a registered C++ type; there is no second table of names. kiln's own kinds are registered in
// kiln/recipe/builtin_kinds.hpp, a user's in a header of theirs, with the same macros:
//
//   KILN_REGISTER_POLICY(my::rmsprop)     // a policy: `using axis = ...; static constexpr kind = "rmsprop";`
//   KILN_REGISTER_MODEL(my::resnet)       // a model's settings: kind, describe(), build(const kiln::data_info&)
//   KILN_REGISTER_DATASET(my::spirals)    // a dataset's settings: kind, describe(), load(const kiln::data_request&)
//   KILN_REGISTER_LOSS(my::huber)         // a loss: kind, describe(), loss(outputs, targets) (kiln/loss.hpp)
//   KILN_REGISTER_SCHEDULE(my::step_decay) // an lr schedule: kind, describe(), factor(step, total) (kiln/schedule.hpp)
//
// at global scope, with the type's fully qualified name: the build writes that name into the
// generated catalog (cmake: kiln_add_recipe_executable(... REGISTER my_kinds.hpp)). Policies
// compose at compile time, so the catalog generator reads this registry to learn which C++
// type each kind of a recipe is; models, datasets, losses and schedules are chosen at run time from it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/data/source.hpp"
#include "kiln/errors.hpp"
#include "kiln/policies.hpp"
#include "kiln/profiler/collector_kinds.hpp"
#include "kiln/recipe/components.hpp"
#include "kiln/settings/any_settings.hpp"
#include "kiln/settings/spelling.hpp"

namespace kiln {

// The axes' names, in kiln/axes.hpp's order: a recipe's [precision], [accumulation], ... tables.
#define KILN_DETAIL_AXIS_NAME(axis_name, default_policy) axis::axis_name::name,
inline constexpr auto axis_names = std::to_array<std::string_view>({KILN_AXES(KILN_DETAIL_AXIS_NAME)});
#undef KILN_DETAIL_AXIS_NAME

inline constexpr std::size_t profiler_axis =
    static_cast<std::size_t>(std::ranges::find(axis_names, axis::profiler::name) - axis_names.begin());

// The kind an axis takes when a recipe leaves it out: its default policy's (kiln/policies.hpp).
inline constexpr std::string_view default_kind(std::string_view axis) {
#define KILN_DETAIL_DEFAULT_KIND(axis_name, default_policy) \
  if (axis == axis::axis_name::name) return defaults::axis_name::kind;
  KILN_AXES(KILN_DETAIL_DEFAULT_KIND)
#undef KILN_DETAIL_DEFAULT_KIND
  return {};
}

struct registered_policy {
  std::string axis;
  std::string kind;
  std::string type;        // the fully qualified C++ type, as the generated catalog names it
  bool collector = false;  // a profiler collector, combined into kiln::profiler::profile<...>
  long order = 0;          // kiln's kinds first, in builtin_kinds.hpp's order; a user's after, by name
};

// A kind of a component table ([model], [data], [loss], [scheduler]): its settings, chosen at
// run time, and what they make from the inputs the table's kinds take.
template <class Made, class... Inputs>
struct registered_component {
  std::string kind;
  std::string type;
  long order = 0;
  std::function<any_settings()> make_settings;  // the kind's settings at their defaults
  std::function<Made(const any_settings&, Inputs...)> make;
};
using registered_model = registered_component<torch::nn::AnyModule, const data_info&>;  // builds the model
using registered_dataset = registered_component<data::loaded, const data_request&>;     // loads train and eval
using registered_loss = registered_component<loss_function>;
using registered_schedule = registered_component<schedule>;

namespace detail {

inline constexpr long user_kind_order = std::numeric_limits<long>::max();

struct kind_registry {
  std::vector<registered_policy> policies;
  std::vector<registered_model> models;
  std::vector<registered_dataset> datasets;
  std::vector<registered_loss> losses;
  std::vector<registered_schedule> schedules;
  std::vector<std::string> conflicts;  // two types under one name: reported when the registry is read
};

inline kind_registry& registry() {
  static kind_registry instance;  // a function's static: safe to fill from other statics' initialisers
  return instance;
}

template <class Entry>
void add_kind(std::vector<Entry>& entries, Entry entry, std::string_view table) {
  for (const auto& e : entries) {
    const bool same_name = e.kind == entry.kind;
    if constexpr (requires { e.axis; }) {
      if (e.axis != entry.axis) continue;
    }
    if (!same_name) continue;
    if (e.type != entry.type)  // the same type registered from several headers is one kind
      registry().conflicts.push_back(std::string(table) + " kind \"" + entry.kind + "\" is registered twice: by " +
                                     e.type + " and by " + entry.type);
    return;
  }
  entries.push_back(std::move(entry));
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.order != b.order ? a.order < b.order : a.kind < b.kind; });
}

inline const kind_registry& checked_registry() {
  const auto& r = registry();
  if (!r.conflicts.empty()) {
    std::string text = "kiln: ";
    for (std::size_t i = 0; i < r.conflicts.size(); ++i) text += (i ? "; " : "") + r.conflicts[i];
    throw config_error(text + " (each recipe kind names one C++ type)");
  }
  return r;
}

// Adds Kind to a component table; make(settings, inputs...) is what its entry makes.
template <class Kind, class Entry, class Make>
void add_component(std::vector<Entry>& entries, std::string_view type, long order, Make make, std::string_view table) {
  add_kind(entries, Entry{std::string(Kind::kind), std::string(type), order, [] { return any_settings(Kind{}); }, make},
           table);
}

}  // namespace detail

// --- registration (through the KILN_REGISTER_* macros) ------------------------------------

template <class P>
bool register_policy(std::string_view type, long order = detail::user_kind_order) {
  if constexpr (check_policy<P>()) {  // a wrong policy stops here with one sentence
    detail::add_kind(detail::registry().policies,
                     registered_policy{std::string(P::axis::name), std::string(P::kind), std::string(type), false, order},
                     std::string(P::axis::name) + " axis:");
  }
  return true;
}

template <class Collector>
bool register_profiler_collector(std::string_view type, long order = detail::user_kind_order) {
  detail::add_kind(detail::registry().policies,
                   registered_policy{std::string(axis::profiler::name), std::string(Collector::kind), std::string(type),
                                     true, order},
                   "profiler collector");
  return true;
}

template <class Model>
bool register_model(std::string_view type, long order = detail::user_kind_order) {
  if constexpr (check_model<Model>())
    detail::add_component<Model>(
        detail::registry().models, type, order,
        [](const any_settings& s, const data_info& d) { return s.get<Model>().build(d); }, "model");
  return true;
}

template <class Dataset>
bool register_dataset(std::string_view type, long order = detail::user_kind_order) {
  if constexpr (check_dataset<Dataset>())
    detail::add_component<Dataset>(
        detail::registry().datasets, type, order,
        [](const any_settings& s, const data_request& r) { return s.get<Dataset>().load(r); }, "data");
  return true;
}

template <class Loss>
bool register_loss(std::string_view type, long order = detail::user_kind_order) {
  if constexpr (check_loss<Loss>())
    detail::add_component<Loss>(
        detail::registry().losses, type, order, [](const any_settings& s) { return loss_function(s.get<Loss>()); },
        "loss");
  return true;
}

template <class Schedule>
bool register_schedule(std::string_view type, long order = detail::user_kind_order) {
  if constexpr (check_schedule<Schedule>())
    detail::add_component<Schedule>(
        detail::registry().schedules, type, order, [](const any_settings& s) { return schedule(s.get<Schedule>()); },
        "scheduler");
  return true;
}

#define KILN_DETAIL_CONCAT2(a, b) a##b
#define KILN_DETAIL_CONCAT(a, b) KILN_DETAIL_CONCAT2(a, b)
#define KILN_DETAIL_REGISTER(call) \
  [[maybe_unused]] static const bool KILN_DETAIL_CONCAT(kiln_registered_, __COUNTER__) = call;

// Registers a policy under its own `kind` on its own axis. At global scope, fully qualified.
#define KILN_REGISTER_POLICY(...) KILN_DETAIL_REGISTER(::kiln::register_policy<__VA_ARGS__>(#__VA_ARGS__))
// Registers a collector of kiln::profiler::profile<...> (kiln/profiler/profile.hpp says what it provides).
#define KILN_REGISTER_PROFILER_COLLECTOR(...) \
  KILN_DETAIL_REGISTER(::kiln::register_profiler_collector<__VA_ARGS__>(#__VA_ARGS__))
// Registers a model's settings type (kiln/recipe/components.hpp says what it provides).
#define KILN_REGISTER_MODEL(...) KILN_DETAIL_REGISTER(::kiln::register_model<__VA_ARGS__>(#__VA_ARGS__))
// Registers a dataset's settings type (kiln/recipe/components.hpp says what it provides).
#define KILN_REGISTER_DATASET(...) KILN_DETAIL_REGISTER(::kiln::register_dataset<__VA_ARGS__>(#__VA_ARGS__))
// Registers a loss (kiln/loss.hpp says what it provides).
#define KILN_REGISTER_LOSS(...) KILN_DETAIL_REGISTER(::kiln::register_loss<__VA_ARGS__>(#__VA_ARGS__))
// Registers a learning-rate schedule (kiln/schedule.hpp says what it provides).
#define KILN_REGISTER_SCHEDULE(...) KILN_DETAIL_REGISTER(::kiln::register_schedule<__VA_ARGS__>(#__VA_ARGS__))

// --- reading it ---------------------------------------------------------------------------

inline const std::vector<registered_policy>& registered_policies() { return detail::checked_registry().policies; }
inline const std::vector<registered_model>& registered_models() {
  return detail::checked_registry().models;
}
inline const std::vector<registered_dataset>& registered_datasets() {
  return detail::checked_registry().datasets;
}
inline const std::vector<registered_loss>& registered_losses() { return detail::checked_registry().losses; }
inline const std::vector<registered_schedule>& registered_schedules() { return detail::checked_registry().schedules; }

inline const registered_policy* find_policy_kind(std::string_view axis, std::string_view kind) {
  for (const auto& k : registered_policies())
    if (k.axis == axis && k.kind == kind) return &k;
  return nullptr;
}

template <class Entry>
const Entry* find_kind(const std::vector<Entry>& entries, std::string_view kind) {
  for (const auto& e : entries)
    if (e.kind == kind) return &e;
  return nullptr;
}

// The kinds of an axis in registry order, but `leave_out`, for error messages.
inline std::vector<std::string> kinds_on_axis(std::string_view axis, std::string_view leave_out = {}) {
  std::vector<std::string> kinds;
  for (const auto& k : registered_policies())
    if (k.axis == axis && k.kind != leave_out) kinds.push_back(k.kind);
  return kinds;
}

template <class Entry>
std::vector<std::string> kind_names(const std::vector<Entry>& entries) {
  std::vector<std::string> kinds;
  for (const auto& e : entries) kinds.push_back(e.kind);
  return kinds;
}

// The C++ type for a kind; for the profiler, kind may name several collectors ("ops+memory"),
// which profile<...> takes in registry order (the order of a canonical profiler kind).
inline std::string policy_type(std::string_view axis, std::string_view kind) {
  const auto* one = find_policy_kind(axis, kind);
  if (one && !one->collector) return one->type;
  std::string type = "kiln::profiler::profile<";
  bool first = true;
  for_each_collector_kind(kind, [&](std::string_view part) {
    const auto* collector = find_policy_kind(axis, part);
    if (!collector || !collector->collector)
      throw config_error("kiln: \"" + std::string(part) + "\" is not a registered profiler collector");
    type += (first ? "" : ", ") + collector->type;
    first = false;
  });
  return type + ">";
}

// What `kiln profile` runs a recipe with: every profiler collector ("ops+trace+memory+phases").
inline std::string profile_all_kind() {
  std::string kind;
  for (const auto& k : registered_policies())
    if (k.collector) kind += (kind.empty() ? "" : "+") + k.kind;
  return kind;
}

// Whether every collector of `subset` is one of `kind`'s ("trace+phases" of "ops+trace+memory+phases").
inline bool profiler_kinds_within(std::string_view subset, std::string_view kind) {
  bool within = !subset.empty() && subset != "none" && kind != "none";
  for_each_collector_kind(subset, [&](std::string_view wanted) {
    bool found = false;
    for_each_collector_kind(kind, [&](std::string_view have) { found = found || have == wanted; });
    within = within && found;
  });
  return within;
}

// A combination is one kind per axis, in axis_names order; its name reads like
// "precision=fp32 accumulation=steps ... profiler=none".
using combination_kinds = std::array<std::string, axis_names.size()>;

inline std::string combination_name(const combination_kinds& kinds) {
  std::string name;
  for (std::size_t i = 0; i < axis_names.size(); ++i) {
    if (i) name += ' ';
    name.append(axis_names[i]).append("=").append(kinds[i]);
  }
  return name;
}

}  // namespace kiln
