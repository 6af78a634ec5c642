// kiln/recipe/components.hpp: what a model, dataset, loss or schedule kind of a recipe provides.
//
// Both are settings structs, registered by type (kiln/recipe/registry.hpp), whose fields are
// the keys of the recipe's [model] or [data] table besides `kind`:
//
//   struct my_resnet {                                   // [model] kind = "my-resnet"
//     static constexpr std::string_view kind = "my-resnet";
//     std::int64_t width = 64;
//     template <class V> void describe(V& v) { v.field("width", width, "channels", kiln::checks::positive); }
//     torch::nn::AnyModule build(const kiln::data_info& data) const;  // throw kiln::config_error if it cannot fit
//   };
//
//   struct my_spirals {                                  // [data] kind = "my-spirals"
//     static constexpr std::string_view kind = "my-spirals";
//     std::int64_t samples = 2048;
//     template <class V> void describe(V& v) { ... }
//     kiln::data::loaded load(const kiln::data_request& request) const;  // train and eval sets
//   };
//
// kiln's own are kiln::models::mlp_settings, cnn_settings, gpt_settings and kiln::data::
// fashion_mnist_settings, text_settings, synthetic_classification_settings,
// synthetic_tokens_settings, synthetic_regression_settings. A loss kind ([loss] kind) is
// described in kiln/loss.hpp (kiln::losses::cross_entropy, next_token, mse, l1), a schedule kind
// ([scheduler] kind) in kiln/schedule.hpp (kiln::schedules::constant, linear, cosine). A type
// missing a member fails to register with one sentence.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/data/source.hpp"
#include "kiln/loss.hpp"
#include "kiln/schedule.hpp"
#include "kiln/settings/any_settings.hpp"

namespace kiln {

namespace detail {

template <class T>
concept component_kind = requires {
  { T::kind } -> std::convertible_to<std::string_view>;
};

struct describe_probe {
  template <class T, class Check>
  void field(std::string_view, T&, std::string_view, Check&&) {}
  template <class T>
  void field(std::string_view, T&, std::string_view) {}
};

template <class T>
concept describes_itself = requires(T& t, describe_probe& v) { t.describe(v); };

// What the first missing member is, as one static_assert sentence naming the table.
template <class T>
consteval bool check_component() {
  if constexpr (!component_kind<T>) {
    static_assert(missing<T>, "kiln: a recipe kind ([model], [data], [loss], [scheduler]) needs `static constexpr std::string_view kind` (its TOML kind)");
    return false;
  } else if constexpr (!std::is_default_constructible_v<T> || !std::is_copy_constructible_v<T>) {
    static_assert(missing<T>, "kiln: a recipe kind's settings must be default-constructible and copyable (the defaults of its keys)");
    return false;
  } else if constexpr (!describes_itself<T>) {
    static_assert(missing<T>, "kiln: a recipe kind is missing `template <class V> void describe(V& v)` listing its keys");
    return false;
  } else {
    return true;
  }
}

}  // namespace detail

template <class Model>
consteval bool check_model() {
  if constexpr (!detail::check_component<Model>()) {
    return false;
  } else if constexpr (!(requires(const Model& m, const data_info& d) {
                           { m.build(d) } -> std::convertible_to<torch::nn::AnyModule>;
                         })) {
    static_assert(detail::missing<Model>,
                  "kiln: [model] kind is missing `torch::nn::AnyModule build(const kiln::data_info&) const`");
    return false;
  } else {
    return true;
  }
}

template <class Loss>
consteval bool check_loss() {
  if constexpr (!detail::check_component<Loss>()) {
    return false;
  } else if constexpr (!loss_kind<Loss>) {
    static_assert(detail::missing<Loss>,
                  "kiln: [loss] kind is missing `torch::Tensor loss(const torch::Tensor& outputs, const torch::Tensor& targets) const`");
    return false;
  } else {
    return true;
  }
}

template <class Schedule>
consteval bool check_schedule() {
  if constexpr (!detail::check_component<Schedule>()) {
    return false;
  } else if constexpr (!schedule_kind<Schedule>) {
    static_assert(detail::missing<Schedule>,
                  "kiln: [scheduler] kind is missing `double factor(std::int64_t step, std::int64_t total) const`");
    return false;
  } else {
    return true;
  }
}

template <class Dataset>
consteval bool check_dataset() {
  if constexpr (!detail::check_component<Dataset>()) {
    return false;
  } else if constexpr (!(requires(const Dataset& d, const data_request& r) {
                           { d.load(r) } -> std::convertible_to<data::loaded>;
                         })) {
    static_assert(detail::missing<Dataset>,
                  "kiln: [data] kind is missing `kiln::data::loaded load(const kiln::data_request&) const`");
    return false;
  } else {
    return true;
  }
}

}  // namespace kiln
