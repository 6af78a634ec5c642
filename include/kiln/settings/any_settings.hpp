// kiln/settings/any_settings.hpp: a settings struct whose type is chosen at run time.
//
// A recipe's [model] and [data] tables hold the settings of whichever kind they name, a type
// found in the registry (kiln/recipe/registry.hpp). any_settings keeps one such struct and
// still describes it field by field, so the recipe reader, the checker and the resolved-recipe
// writer visit it like any other settings struct. It does so by recording the fields the
// struct's describe() lists, then handing each to the visitor: the list a kind describes must
// therefore not depend on values read in the same call. This header does not depend on LibTorch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <variant>
#include <vector>

#include "kiln/errors.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln {

namespace detail {

template <class T>
struct recorded_field {
  std::string key, help;
  T* value;
  std::function<std::optional<std::string>(const T&)> check;
};

// An enum-like field, whatever its enum: visited as its name, checked against the names.
struct recorded_choice {
  std::string key, help;
  std::function<std::string()> name;
  std::function<void(const std::string&)> set;  // a name among `names`
  std::vector<std::string> names;
};

// One entry per field type that kiln/settings/fields.hpp allows.
using any_field = std::variant<recorded_field<bool>, recorded_field<std::int64_t>, recorded_field<double>,
                               recorded_field<std::string>, recorded_field<std::vector<std::int64_t>>,
                               recorded_field<std::vector<double>>, recorded_field<std::vector<std::string>>,
                               recorded_choice>;

struct field_recorder {
  std::vector<any_field> fields;
  template <class T, class Check>
  void field(std::string_view key, T& value, std::string_view help, Check&& check) {
    if constexpr (choice_enum<T>)
      fields.emplace_back(recorded_choice{std::string(key), std::string(help), [&value] { return choice_name(value); },
                                          [&value](const std::string& name) { value = *parse_choice<T>(name); },
                                          choice_names<T>()});
    else
      fields.emplace_back(recorded_field<T>{std::string(key), std::string(help), &value, std::forward<Check>(check)});
  }
  template <class T>
  void field(std::string_view key, T& value, std::string_view help) {
    field(key, value, help, checks::any);
  }
};

}  // namespace detail

class any_settings {
 public:
  any_settings() = default;
  template <class Settings>
  explicit any_settings(Settings settings) : self_(std::make_unique<holder<Settings>>(std::move(settings))) {}
  any_settings(const any_settings& other) : self_(other.self_ ? other.self_->clone() : nullptr) {}
  any_settings& operator=(const any_settings& other) {
    if (this != &other) self_ = other.self_ ? other.self_->clone() : nullptr;
    return *this;
  }
  any_settings(any_settings&&) noexcept = default;
  any_settings& operator=(any_settings&&) noexcept = default;

  bool empty() const { return !self_; }
  // The held type's `kind` ("" when empty).
  std::string_view kind() const { return self_ ? self_->kind() : std::string_view{}; }

  template <class Settings>
  Settings* get_if() {
    return self_ && self_->type() == typeid(Settings) ? static_cast<Settings*>(self_->get()) : nullptr;
  }
  template <class Settings>
  const Settings* get_if() const {
    return self_ && self_->type() == typeid(Settings) ? static_cast<const Settings*>(self_->get()) : nullptr;
  }
  template <class Settings>
  const Settings& get() const {
    if (const auto* s = get_if<Settings>()) return *s;
    throw config_error("kiln: the settings held are those of kind \"" + std::string(kind()) + "\", not the type asked for");
  }

  template <class V>
  void describe(V& v) {
    if (!self_) return;
    detail::field_recorder recorder;
    self_->describe(recorder);
    for (auto& field : recorder.fields)
      std::visit(
          [&]<class F>(F& f) {
            if constexpr (std::is_same_v<F, detail::recorded_choice>) {
              std::string name = f.name();
              v.field(f.key, name, f.help, checks::one_of(f.names));
              if (std::ranges::find(f.names, name) != f.names.end()) f.set(name);
            } else {
              v.field(f.key, *f.value, f.help, f.check);
            }
          },
          field);
  }

 private:
  struct base {
    virtual ~base() = default;
    virtual std::unique_ptr<base> clone() const = 0;
    virtual void describe(detail::field_recorder&) = 0;
    virtual std::string_view kind() const = 0;
    virtual const std::type_info& type() const = 0;
    virtual void* get() const = 0;
  };
  template <class Settings>
  struct holder final : base {
    explicit holder(Settings s) : value(std::move(s)) {}
    std::unique_ptr<base> clone() const override { return std::make_unique<holder>(value); }
    void describe(detail::field_recorder& r) override { value.describe(r); }
    std::string_view kind() const override { return Settings::kind; }
    const std::type_info& type() const override { return typeid(Settings); }
    void* get() const override { return const_cast<Settings*>(&value); }
    Settings value;
  };
  std::unique_ptr<base> self_;
};

}  // namespace kiln
