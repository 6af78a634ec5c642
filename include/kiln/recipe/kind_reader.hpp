// kiln/recipe/kind_reader.hpp: reads an axis table's `kind` into its canonical name.
//
// Shared by the recipe reader and the catalog generator so that both agree on what a recipe
// asks for. The profiler takes a list (kind = ["ops", "memory"]), named "ops+memory" in the
// registry's order (kiln/recipe/builtin_kinds.hpp) whatever the order in the recipe.
#pragma once

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "kiln/errors.hpp"
#include "kiln/recipe/registry.hpp"
#include "kiln/recipe/toml_visitors.hpp"

namespace kiln::detail {

inline std::string read_policy_kind(const toml::node& node, const std::string& axis, const std::string& where,
                                    const std::string& field = "kind") {
  const std::string key = axis + "." + field;
  if (axis == "profiler" && node.is_array()) {
    std::set<std::string> chosen;
    for (const auto& element : *node.as_array()) {
      auto name = element.value<std::string>();
      if (!name)
        throw config_error(where + ": " + key + ": expected an array of strings, got " +
                           mismatch_text<std::vector<std::string>>(node));
      if (*name == "none") throw config_error(where + ": " + key + ": \"none\" cannot be combined with other profilers");
      if (const auto* k = find_policy_kind(axis, *name); !k || !k->collector) {
        const auto listable = kinds_on_axis(axis, "none");  // what a list may hold
        throw config_error(where + ": " + key + ": \"" + *name + "\" is not a profiler" + did_you_mean(*name, listable) +
                           "; a list takes " + quoted_list(listable));
      }
      if (!chosen.insert(*name).second) throw config_error(where + ": " + key + ": \"" + *name + "\" is listed twice");
    }
    if (chosen.empty()) throw config_error(where + ": " + key + ": an empty list; use kind = \"none\" for no profiler");
    std::string canonical;
    for (const auto& k : registered_policies())
      if (k.axis == axis && chosen.count(k.kind)) canonical += (canonical.empty() ? "" : "+") + k.kind;
    return canonical;
  }
  auto value = node.value<std::string>();
  if (!value)
    throw config_error(where + ": " + key + ": expected a string" + (axis == "profiler" ? " or an array of strings" : "") +
                       ", got " + toml_type_name(node));
  if (!find_policy_kind(axis, *value))
    throw config_error(where + ": " + key + " = \"" + *value + "\": expected one of " + quoted_list(kinds_on_axis(axis)) +
                       did_you_mean(*value, kinds_on_axis(axis)));
  return *value;
}

// An axis table's `alternatives`: the other kinds a recipe can be switched to with
// `--set AXIS.kind=...`, which the build compiles alongside the recipe's own combination (one
// axis changed at a time). `where(element)` names an element's file:line.
template <class Where>
std::vector<std::string> read_policy_alternatives(const toml::node& node, const std::string& axis, Where&& where) {
  const auto* list = node.as_array();
  if (!list)
    throw config_error(where(node) + ": " + axis + ".alternatives: expected an array of kinds, got " + toml_type_name(node));
  std::vector<std::string> kinds;
  for (const auto& element : *list) {
    auto kind = read_policy_kind(element, axis, where(element), "alternatives");
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end())
      throw config_error(where(element) + ": " + axis + ".alternatives: \"" + kind + "\" is listed twice");
    kinds.push_back(std::move(kind));
  }
  return kinds;
}

// Every axis's `kind` (the default where a recipe leaves it out) and `alternatives`.
struct axis_kinds {
  combination_kinds kinds;
  std::array<std::vector<std::string>, axis_names.size()> alternatives;
};

// Reads them from a recipe document; `where(dotted_key, node)` names a node's place ("file:line").
template <class Where>
axis_kinds read_axis_kinds(const toml::table& document, Where&& where) {
  axis_kinds out;
  for (std::size_t i = 0; i < axis_names.size(); ++i) {
    const std::string axis(axis_names[i]);
    out.kinds[i] = std::string(default_kind(axis));
    const toml::table* table = document[axis].as_table();
    if (!table) continue;
    if (const toml::node* kind = table->get("kind"))
      out.kinds[i] = read_policy_kind(*kind, axis, where(axis + ".kind", *kind));
    if (const toml::node* alternatives = table->get("alternatives"))
      out.alternatives[i] = read_policy_alternatives(
          *alternatives, axis, [&](const toml::node& n) { return where(axis + ".alternatives", n); });
  }
  return out;
}

}  // namespace kiln::detail
