// kiln/recipe/toml_visitors.hpp: the two visitors over settings structs' describe() lists:
// one reads a TOML table strictly, one writes settings back as TOML.
//
// Strict means: an unknown key, a value of the wrong type or one that fails its check stops
// with "file:line: table.key ...: expected ..."; nothing is ignored or silently converted.
// This header does not depend on LibTorch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "kiln/errors.hpp"
#include "kiln/settings/fields.hpp"
#include "kiln/settings/spelling.hpp"

namespace kiln::detail {

inline std::string toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

inline std::string toml_value_text(const toml::node& node) {
  std::ostringstream out;
  node.visit([&](const auto& v) {
    if constexpr (toml::is_table<decltype(v)>) out << "{...}";
    else out << v;
  });
  return out.str();
}

template <class T>
constexpr const char* expected_type_name() {
  if constexpr (std::is_same_v<T, bool>) return "a boolean (true or false)";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "an integer";
  else if constexpr (std::is_same_v<T, double>) return "a number";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) return "an array of integers";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return "an array of numbers";
  else return "an array of strings";
}

// Where a node came from: "recipes/x.toml:12" or "--set optimizer.lr=...".
struct source_map {
  std::string file;
  std::map<std::string, std::string> overrides;  // "table.key" -> "--set table.key=value"

  std::string where(const std::string& dotted, const toml::source_region& region) const {
    if (auto it = overrides.find(dotted); it != overrides.end()) return it->second;
    return file + ":" + std::to_string(region.begin.line);
  }
};

template <class T>
bool convert_scalar(const toml::node& node, T& out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (auto v = node.as_boolean()) return out = v->get(), true;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    if (auto v = node.as_integer()) return out = v->get(), true;
  } else if constexpr (std::is_same_v<T, double>) {
    // An integer where a number is expected is fine (lr = 1); the other way round is not.
    if (auto v = node.as_floating_point()) return out = v->get(), true;
    if (auto v = node.as_integer()) return out = static_cast<double>(v->get()), true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto v = node.as_string()) return out = v->get(), true;
  }
  return false;
}

// A settings field that TOML writes as an array (std::vector<...>); a string is no list.
template <class T>
concept toml_list = requires { typename T::value_type; } && !std::is_same_v<T, std::string>;

template <class T>
bool convert(const toml::node& node, T& out) {
  if constexpr (toml_list<T>) {
    auto array = node.as_array();
    if (!array) return false;
    T values;
    for (const auto& element : *array) {
      typename T::value_type v{};
      if (!convert_scalar(element, v)) return false;
      values.push_back(std::move(v));
    }
    out = std::move(values);
    return true;
  } else {
    return convert_scalar(node, out);
  }
}

// What a node that convert() refused is, for the error: its type and value, and for an array
// the first element of the wrong type, which in a long list is what the reader is looking for.
template <class T>
std::string mismatch_text(const toml::node& node) {
  if constexpr (toml_list<T>) {
    if (const auto* array = node.as_array()) {
      for (std::size_t i = 0; i < array->size(); ++i) {
        typename T::value_type ignored{};
        const toml::node& element = *array->get(i);
        if (!convert_scalar(element, ignored))
          return "an array whose element " + std::to_string(i) + " is " + toml_type_name(element) + " (" +
                 toml_value_text(element) + ")";
      }
    }
  }
  return toml_type_name(node) + " (" + toml_value_text(node) + ")";
}

// Reads one TOML table into a settings struct through its describe().
class toml_reader {
 public:
  toml_reader(const toml::table* table, std::string table_name, const source_map& sources,
              toml::source_region table_region)
      : table_(table), name_(std::move(table_name)), sources_(&sources), region_(table_region) {}

  template <class T, class Check>
  void field(std::string_view key, T& value, std::string_view /*help*/, Check&& check) {
    known_.emplace_back(key);
    const std::string dotted = name_ + "." + std::string(key);
    const toml::node* node = table_ ? table_->get(key) : nullptr;
    if (!node) {
      // Defaults are valid by construction, but settings built elsewhere may not be.
      if (auto error = check(value)) throw config_error(sources_->where(dotted, region_) + ": " + dotted + ": " + *error);
      return;
    }
    const auto where = sources_->where(dotted, node->source());
    if constexpr (choice_enum<T>) {
      const auto* name = node->as_string();
      if (!name)
        throw config_error(where + ": " + dotted + ": expected one of " + quoted_list(choice_names<T>()) + ", got " +
                           mismatch_text<T>(*node));
      const auto parsed = parse_choice<T>(name->get());
      if (!parsed) throw config_error(where + ": " + dotted + " = " + toml_value_text(*node) + ": " + choice_error<T>(name->get()));
      value = *parsed;
    } else if (!convert(*node, value))
      throw config_error(where + ": " + dotted + ": expected " + expected_type_name<T>() + ", got " +
                         mismatch_text<T>(*node));
    if (auto error = check(value))
      throw config_error(where + ": " + dotted + " = " + toml_value_text(*node) + ": " + *error);
  }
  template <class T>
  void field(std::string_view key, T& value, std::string_view help) {
    field(key, value, help, checks::any);
  }

  // After describe(): every key of the table must have been asked for.
  void reject_unknown_keys(const std::set<std::string>& also_known = {}) const {
    if (!table_) return;
    for (const auto& [key, node] : *table_) {
      const std::string k(key.str());
      if (std::find(known_.begin(), known_.end(), k) != known_.end() || also_known.count(k)) continue;
      std::vector<std::string> candidates = known_;
      candidates.insert(candidates.end(), also_known.begin(), also_known.end());
      std::string list;
      for (const auto& c : candidates) list += (list.empty() ? "" : ", ") + c;
      if (known_.empty() && also_known.count("kind")) list = "no keys besides kind and alternatives";
      throw config_error(sources_->where(name_ + "." + k, key.source()) + ": unknown key " + name_ + "." + k +
                         did_you_mean(k, candidates) + "; [" + name_ + "] accepts: " + list);
    }
  }

 private:
  const toml::table* table_;
  std::string name_;
  const source_map* sources_;
  toml::source_region region_;
  std::vector<std::string> known_;
};

template <class T>
void write_toml_value(std::ostream& out, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    out << (value ? "true" : "false");
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    out << value;
  } else if constexpr (std::is_same_v<T, double>) {
    std::ostringstream text;
    text.precision(17);
    text << value;
    auto s = text.str();
    // TOML floats need a '.' or an exponent; keep 1e-3 readable rather than 0.00100000000000000002.
    std::ostringstream shorter;
    shorter << value;
    if (std::stod(shorter.str()) == value) s = shorter.str();
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    out << s;
  } else if constexpr (std::is_same_v<T, std::string>) {
    out << toml::value<std::string>(value);
  } else if constexpr (choice_enum<T>) {
    out << toml::value<std::string>(choice_name(value));
  } else {
    out << "[";
    for (std::size_t i = 0; i < value.size(); ++i) {
      if (i) out << ", ";
      write_toml_value(out, value[i]);
    }
    out << "]";
  }
}

// Writes a settings struct as `key = value  # help` lines.
class toml_writer {
 public:
  explicit toml_writer(std::ostream& out) : out_(&out) {}
  template <class T, class Check>
  void field(std::string_view key, T& value, std::string_view help, Check&&) {
    std::ostringstream line;
    line << key << " = ";
    write_toml_value(line, value);
    auto text = line.str();
    *out_ << text;
    if (!help.empty()) *out_ << std::string(text.size() < 32 ? 32 - text.size() : 1, ' ') << "# " << help;
    *out_ << "\n";
  }
  template <class T>
  void field(std::string_view key, T& value, std::string_view help) {
    field(key, value, help, checks::any);
  }

 private:
  std::ostream* out_;
};

}  // namespace kiln::detail
