// kiln/recipe/kinds.hpp: which policy a recipe's `kind = "..."` names on each axis, and the
// C++ type that implements it.
//
// The build reads recipes with this table to decide which policy combinations to compile
// (tools/kiln/catalog_gen.cpp), and the CLI uses it to name a recipe's combination. It does
// not depend on LibTorch so that the catalog generator builds in seconds. A new policy is
// added here once; the generated catalog static_asserts that each type's own `kind` matches.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/profiler/collector_kinds.hpp"

namespace kiln {

inline constexpr std::array<std::string_view, 6> axis_names = {"precision",  "accumulation", "checkpointing",
                                                               "sharding",   "optimizer",    "profiler"};

inline constexpr std::size_t profiler_axis = axis_names.size() - 1;
static_assert(axis_names[profiler_axis] == "profiler");

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

struct policy_kind {
  std::string_view axis;
  std::string_view kind;
  std::string_view type;  // fully qualified C++ type
};

// The first entry of each axis is its default (kiln::defaults in kiln/policies.hpp).
inline constexpr policy_kind policy_kinds[] = {
    {"precision", "fp32", "kiln::precision::fp32"},
    {"precision", "bf16", "kiln::precision::bf16"},
    {"precision", "fp16", "kiln::precision::fp16"},
    {"precision", "bf16-pure", "kiln::precision::bf16_pure"},
    {"accumulation", "steps", "kiln::accumulation::steps"},
    {"checkpointing", "none", "kiln::checkpointing::none"},
    {"checkpointing", "blocks", "kiln::checkpointing::blocks"},
    {"checkpointing", "every-nth", "kiln::checkpointing::every_nth"},
    {"checkpointing", "selective", "kiln::checkpointing::selective"},
    {"sharding", "single", "kiln::sharding::single"},
    {"sharding", "ddp", "kiln::sharding::ddp"},
    {"sharding", "local-sgd", "kiln::sharding::local_sgd"},
    {"optimizer", "sgd", "kiln::optim::sgd"},
    {"optimizer", "adamw", "kiln::optim::adamw"},
    {"optimizer", "adafactor", "kiln::optim::adafactor"},
    {"optimizer", "adam8bit", "kiln::optim::adam8bit"},
    {"optimizer", "lion", "kiln::optim::lion"},
    {"profiler", "none", "kiln::profiler::none"},
    // Profiler kinds combine: kind = ["ops", "memory"] is kiln::profiler::profile<ops_collector,
    // memory_collector>, named "ops+memory" (in this table's order).
    {"profiler", "ops", "kiln::profiler::ops_collector"},
    {"profiler", "trace", "kiln::profiler::trace_collector"},
    {"profiler", "memory", "kiln::profiler::memory_collector"},
    {"profiler", "phases", "kiln::profiler::phases_collector"},
};

// What `kiln profile` runs a recipe with: every profiler collector.
inline constexpr std::string_view profile_all_kind = "ops+trace+memory+phases";

inline constexpr std::string_view default_kind(std::string_view axis) {
  for (const auto& k : policy_kinds)
    if (k.axis == axis) return k.kind;
  return {};
}

inline constexpr const policy_kind* find_policy_kind(std::string_view axis, std::string_view kind) {
  for (const auto& k : policy_kinds)
    if (k.axis == axis && k.kind == kind) return &k;
  return nullptr;
}

// The C++ type for a kind; for the profiler, kind may name several collectors ("ops+memory").
inline std::string policy_type(std::string_view axis, std::string_view kind) {
  if (axis != "profiler" || kind == "none")
    return std::string(find_policy_kind(axis, kind)->type);
  std::string type = "kiln::profiler::profile<";
  bool first = true;
  for_each_collector_kind(kind, [&](std::string_view one) {
    type += (first ? "" : ", ") + std::string(find_policy_kind(axis, one)->type);
    first = false;
  });
  return type + ">";
}

// The kinds of an axis in this table's order, but `leave_out`, for error messages.
inline std::vector<std::string> kinds_on_axis(std::string_view axis, std::string_view leave_out = {}) {
  std::vector<std::string> kinds;
  for (const auto& k : policy_kinds)
    if (k.axis == axis && k.kind != leave_out) kinds.emplace_back(k.kind);
  return kinds;
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
