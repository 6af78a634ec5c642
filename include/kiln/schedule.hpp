// kiln/schedule.hpp: learning-rate schedules, the factor of the optimizer's base lr at each step.
//
// A schedule kind is a settings struct with its own `kind` and a pure function of the step
// (0-based, of `total` optimizer steps), so resuming at step s gives exactly the lr an
// uninterrupted run had:
//
//   struct step_decay {                                     // [scheduler] kind = "step-decay"
//     static constexpr std::string_view kind = "step-decay";
//     std::int64_t every = 1000;
//     double gamma = 0.5;
//     template <class V> void describe(V& v) { v.field("every", every, "...", kiln::checks::positive); ... }
//     double factor(std::int64_t step, std::int64_t total) const { return std::pow(gamma, step / every); }
//   };
//
// KILN_REGISTER_SCHEDULE (kiln/recipe/registry.hpp) lets a recipe name it. kiln's own kinds,
// the shapes of transformers' get_*_schedule_with_warmup: a linear warmup from ~0 to 1 over
// `warmup_steps`, then schedules::constant, linear decay to `min_factor` (schedules::linear), or
// half a cosine down to `min_factor` (schedules::cosine). kiln::schedule holds any kind; it is
// the accelerator's `scheduler` setting:
//   settings.scheduler = kiln::schedules::cosine{.warmup_steps = 100, .min_factor = 0.1};
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <numbers>
#include <string_view>

#include "kiln/settings/any_settings.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln {

template <class S>
concept schedule_kind = requires(const S& s, std::int64_t step) {
  { S::kind } -> std::convertible_to<std::string_view>;
  { s.factor(step, step) } -> std::convertible_to<double>;
};

namespace schedules {

namespace detail {

inline double warmup_factor(std::int64_t step, std::int64_t warmup_steps) {
  return static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
}

// How far step is through the decay that follows the warmup, in [0, 1].
inline double decay_progress(std::int64_t step, std::int64_t total, std::int64_t warmup_steps) {
  const auto decay_steps = std::max<std::int64_t>(1, total - warmup_steps);
  return std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
}

template <class V>
void describe_warmup(V& v, std::int64_t& warmup_steps) {
  v.field("warmup_steps", warmup_steps, "optimizer steps of linear warmup", kiln::checks::non_negative);
}

}  // namespace detail

struct constant {
  static constexpr std::string_view kind = "constant";
  std::int64_t warmup_steps = 0;

  template <class V>
  void describe(V& v) {
    detail::describe_warmup(v, warmup_steps);
  }
  double factor(std::int64_t step, std::int64_t /*total*/) const {
    return step < warmup_steps ? detail::warmup_factor(step, warmup_steps) : 1.0;
  }
};

// A linear warmup, then a decay of the given shape down to min_factor: linear and cosine.
template <class Shape>
struct decay {
  static constexpr std::string_view kind = Shape::kind;
  std::int64_t warmup_steps = 0;
  double min_factor = 0.0;

  template <class V>
  void describe(V& v) {
    detail::describe_warmup(v, warmup_steps);
    v.field("min_factor", min_factor, "final lr as a fraction of the base lr", kiln::checks::in_range(0.0, 1.0));
  }
  double factor(std::int64_t step, std::int64_t total) const {
    if (step < warmup_steps) return detail::warmup_factor(step, warmup_steps);
    return min_factor + (1.0 - min_factor) * Shape::at(detail::decay_progress(step, total, warmup_steps));
  }
};

namespace detail {
struct linear_shape {
  static constexpr std::string_view kind = "linear";
  static double at(double progress) { return 1.0 - progress; }
};
struct cosine_shape {  // half a cosine
  static constexpr std::string_view kind = "cosine";
  static double at(double progress) { return 0.5 * (1.0 + std::cos(std::numbers::pi * progress)); }
};
}  // namespace detail

using linear = decay<detail::linear_shape>;
using cosine = decay<detail::cosine_shape>;

}  // namespace schedules

// Any schedule kind, chosen in C++ or by a recipe's [scheduler] table. Its settings are
// described (and so validated) like any other settings struct.
class schedule {
 public:
  schedule() : schedule(schedules::constant{}) {}
  template <schedule_kind S>
  schedule(S s) : settings_(std::move(s)), factor_(&factor_of<S>) {}  // NOLINT: implicit, like a value

  std::string_view kind() const { return settings_.kind(); }
  double factor(std::int64_t step, std::int64_t total) const { return factor_(settings_, step, total); }
  // The kind's settings, e.g. get_if<kiln::schedules::cosine>(); nullptr if it is another kind.
  template <class S>
  const S* get_if() const {
    return settings_.get_if<S>();
  }
  template <class V>
  void describe(V& v) {
    settings_.describe(v);
  }

 private:
  template <class S>
  static double factor_of(const any_settings& s, std::int64_t step, std::int64_t total) {
    return s.get<S>().factor(step, total);
  }
  any_settings settings_;
  double (*factor_)(const any_settings&, std::int64_t, std::int64_t);
};

}  // namespace kiln
