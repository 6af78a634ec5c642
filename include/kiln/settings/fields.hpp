// kiln/settings/fields.hpp: how a settings struct describes itself.
//
// Every settings struct in kiln (a policy's, a model's, the data's) mirrors one TOML table
// field for field. Instead of writing a parser and a printer for each, a settings struct
// lists its fields once in a `describe` member template:
//
//   struct settings {
//     double lr = 1e-3;
//     template <class V> void describe(V& v) {
//       v.field("lr", lr, "learning rate", kiln::checks::positive);
//     }
//   };
//
// The recipe reader, `kiln check`'s printer and the resolved-recipe writer are all visitors
// over that one list, so the TOML schema, the validation and the documentation cannot drift.
// This header does not depend on LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/errors.hpp"
#include "kiln/settings/spelling.hpp"

namespace kiln {

// Field types a settings struct may use; a visitor must handle each of them.
//   bool, std::int64_t, double, std::string,
//   std::vector<std::int64_t>, std::vector<double>, std::vector<std::string>,
//   and an enum-like setting: an enum whose names a `choices` function next to it lists,
//
//     enum class partial_window { step, drop };
//     constexpr auto choices(partial_window) {
//       return std::to_array<kiln::choice<partial_window>>({{"step", partial_window::step}, {"drop", partial_window::drop}});
//     }
//
//   which a recipe writes by name ("drop"); a name not listed is refused with the list and a
//   "did you mean", in a recipe and in C++ (a value cast from a number) alike.
template <class E>
struct choice {
  std::string_view name;
  E value;
};
template <class T>
concept choice_enum = std::is_enum_v<T> && requires(T t) {
  { choices(t).size() } -> std::convertible_to<std::size_t>;
};

namespace detail {
template <choice_enum E>
std::vector<std::string> choice_names() {
  std::vector<std::string> names;
  for (const auto& c : choices(E{})) names.emplace_back(c.name);
  return names;
}
template <choice_enum E>
std::optional<E> parse_choice(std::string_view name) {
  for (const auto& c : choices(E{}))
    if (c.name == name) return c.value;
  return std::nullopt;
}
// The name that stands for the value; none for one cast from an out-of-range number.
template <choice_enum E>
std::optional<std::string_view> find_choice_name(E value) {
  for (const auto& c : choices(E{}))
    if (c.value == value) return c.name;
  return std::nullopt;
}
template <choice_enum E>
bool is_named(E value) {
  return find_choice_name(value).has_value();
}
// The value's name; a value no name stands for shows as that number.
template <choice_enum E>
std::string choice_name(E value) {
  const auto found = find_choice_name(value);
  return found ? std::string(*found) : std::to_string(static_cast<long long>(value));
}
template <choice_enum E>
std::string choice_error(std::string_view name) {
  return "expected one of " + quoted_list(choice_names<E>()) + did_you_mean(std::string(name), choice_names<E>());
}
}  // namespace detail

// A check takes the value and returns an error text ("expected ...") or nothing.
namespace checks {

inline constexpr auto any = [](const auto&) -> std::optional<std::string> { return std::nullopt; };

inline constexpr auto positive = [](const auto& value) -> std::optional<std::string> {
  if (value > 0) return std::nullopt;
  return std::string("expected a value > 0");
};

inline constexpr auto non_negative = [](const auto& value) -> std::optional<std::string> {
  if (value >= 0) return std::nullopt;
  return std::string("expected a value >= 0");
};

inline constexpr auto each_positive = [](const auto& values) -> std::optional<std::string> {
  for (const auto& value : values)
    if (!(value > 0)) return std::string("expected every element to be > 0");
  return std::nullopt;
};

inline constexpr auto not_empty = [](const auto& value) -> std::optional<std::string> {
  if (!value.empty()) return std::nullopt;
  return std::string("expected a non-empty value");
};

// Closed interval [lo, hi].
inline auto in_range(double lo, double hi) {
  return [lo, hi](const auto& value) -> std::optional<std::string> {
    if (value >= lo && value <= hi) return std::nullopt;
    std::ostringstream out;
    out << "expected a value in [" << lo << ", " << hi << "]";
    return out.str();
  };
}

// Half-open interval [lo, hi), e.g. probabilities that must stay below 1.
inline auto in_range_open(double lo, double hi) {
  return [lo, hi](const auto& value) -> std::optional<std::string> {
    if (value >= lo && value < hi) return std::nullopt;
    std::ostringstream out;
    out << "expected a value in [" << lo << ", " << hi << ")";
    return out.str();
  };
}

inline auto one_of(std::vector<std::string> allowed) {
  return [allowed = std::move(allowed)](const std::string& value) -> std::optional<std::string> {
    for (const auto& a : allowed)
      if (a == value) return std::nullopt;
    return "expected one of " + detail::quoted_list(allowed) + detail::did_you_mean(value, allowed);
  };
}

}  // namespace checks

// Calls describe() on a settings struct and runs every check: settings built in C++
// (without a recipe) are validated the same way as settings read from TOML.
namespace detail {
// A value as a recipe would spell it (and as toml++ prints it), for messages.
inline std::string value_text(const std::string& v) { return "'" + v + "'"; }
inline std::string value_text(bool v) { return v ? "true" : "false"; }
inline std::string value_text(std::int64_t v) { return std::to_string(v); }
inline std::string value_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}
template <choice_enum E>
std::string value_text(E v) {
  return is_named(v) ? "'" + choice_name(v) + "'" : choice_name(v);
}
template <class T>
std::string value_text(const std::vector<T>& values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + value_text(values[i]);
  return text + "]";
}

struct check_visitor {
  std::string table;
  std::vector<std::string> errors;
  template <class T, class Check>
  void field(std::string_view key, T& value, std::string_view /*help*/, Check&& check) {
    std::optional<std::string> error;
    if constexpr (choice_enum<T>)
      if (!is_named(value)) error = "expected one of " + quoted_list(choice_names<T>());
    if (!error) error = check(value);
    if (error) errors.push_back(table + "." + std::string(key) + " = " + value_text(value) + ": " + *error);
  }
  template <class T>
  void field(std::string_view key, T& value, std::string_view help) {
    field(key, value, help, checks::any);
  }
};
}  // namespace detail

// Returns the list of violated checks, each "table.key: expected ...".
template <class Settings>
std::vector<std::string> validate(Settings& settings, std::string table = "settings") {
  detail::check_visitor visitor{std::move(table), {}};
  settings.describe(visitor);
  return visitor.errors;
}

// Throws a config_error with every violated check, one per line; does nothing when there are none.
inline void throw_if_invalid(const std::vector<std::string>& errors) {
  if (errors.empty()) return;
  std::string text = errors.front();
  for (std::size_t i = 1; i < errors.size(); ++i) text += "\n" + errors[i];
  throw config_error(text);
}

// `settings` when every check of its describe() holds; a config_error naming each that fails
// otherwise, worded as for a recipe ("optimizer.lr: expected > 0, got -1"). For settings built
// in C++, which no recipe reader has seen.
template <class Settings>
Settings checked(Settings settings, std::string table) {
  throw_if_invalid(validate(settings, std::move(table)));
  return settings;
}

}  // namespace kiln
