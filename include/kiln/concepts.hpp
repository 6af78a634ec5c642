// kiln/concepts.hpp: what a policy on each axis (kiln/axes.hpp) must provide.
//
// A policy names its axis with `using axis = kiln::axis::<name>;`. The members each axis
// requires are listed once below, both as a C++20 concept (for users who constrain their own
// templates) and as a series of static_asserts (so a wrong policy fails with one sentence that
// names the axis and the missing member instead of a template backtrace). The default policy
// of each axis (precision/fp32.hpp, optim/sgd.hpp, ...) is the template to copy.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <string_view>
#include <type_traits>

#include <torch/torch.h>

#include "kiln/axes.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln {

// Phases of a training step, as the profiler axis sees them.
enum class phase { data, forward, backward, optimizer, communication, evaluation };

namespace profiler {
// What a profiler's optional attach() learns about the run when accelerator::prepare() runs.
struct profile_context {
  torch::nn::Module* model = nullptr;
  std::int64_t rank = 0;
  std::function<std::int64_t()> optimizer_state_bytes;
};
}  // namespace profiler

// What the loss of one micro-batch is a mean over, as the accumulation axis normalises it:
// the micro-batch itself (a plain mean over micro-batches), its samples, or its tokens
// (targets other than the loss's ignore index, -100).
enum class loss_unit { micro_batch, sample, token };
// As [accumulation] normalize names them.
constexpr auto choices(loss_unit) {
  return std::to_array<choice<loss_unit>>(
      {{"mean", loss_unit::micro_batch}, {"samples", loss_unit::sample}, {"tokens", loss_unit::token}});
}

// Maps this rank's count of loss units to the mean count over the ranks whose gradients are
// averaged together (DDP), so that the accumulation axis normalises by the job's total rather
// than each rank's own. Empty where a rank's gradients are its own (one process, local SGD).
using rank_mean = std::function<double(double)>;

// --- What every policy has -------------------------------------------------------------
template <class P>
concept names_an_axis = requires { typename P::axis; };

template <class P>
concept has_kind = requires {
  { P::kind } -> std::convertible_to<std::string_view>;
};

template <class P>
concept has_settings = requires { typename P::settings; } && std::is_default_constructible_v<typename P::settings>;

template <class P>
concept constructible_from_settings = has_settings<P> && std::constructible_from<P, const typename P::settings&>;

template <class P>
concept policy_basics = names_an_axis<P> && has_kind<P> && constructible_from_settings<P>;

// --- One concept per axis ------------------------------------------------------------
// precision: owns the autocast scope, loss scaling and the finite check of gradients.
template <class P>
concept precision_policy =
    policy_basics<P> && std::same_as<typename P::axis, axis::precision> &&
    requires(P& p, const P& cp, const torch::Tensor& loss, std::vector<torch::Tensor>& params, bool finite) {
      cp.autocast();                                            // RAII scope around forward + loss
      { cp.scale(loss) } -> std::convertible_to<torch::Tensor>;  // loss to call backward() on
      { p.unscale_and_check(params) } -> std::same_as<bool>;     // true when every gradient is finite
      p.update(finite);                                          // after the (rank-agreed) finite check
    };
// Optional, called when present:
//   static constexpr bool always_finite = true     never skips a step: the ranks need not agree on it
//   void use_device(const torch::Device&)          learns the device; refuses one it cannot run on
//   prepare(torch::nn::Module&, named parameters) -> named parameters (a vector of name, tensor pairs):
//                                                  keeps weights of its own (bf16-pure's fp32 masters),
//                                                  which the optimizer then updates instead
//   bool kahan_summation() const                   asks the optimizer for Kahan-summed updates
//   void after_step()                              after each update (round its weights into the model)
//   void save_state(state_dict&, const std::string& prefix) const, void load_state(const state_dict&, prefix)

// accumulation: how many micro-batches make one optimizer step and how the loss is normalised.
template <class P>
concept accumulation_policy =
    policy_basics<P> && std::same_as<typename P::axis, axis::accumulation> &&
    requires(P& p, const P& cp, const torch::Tensor& loss, double items, const rank_mean& mean) {
      { cp.micro_steps() } -> std::convertible_to<std::int64_t>;
      { cp.unit() } -> std::same_as<loss_unit>;
      { p.normalize(loss, items, mean) } -> std::convertible_to<torch::Tensor>;  // loss to call backward on
      { p.end_window(mean) } -> std::convertible_to<double>;  // factor the window's gradients still need
    };
// Optional: bool drop_partial_window() const (skip an epoch's last, short window instead of
// stepping over what it holds); save_state / load_state as above.

// checkpointing: which sub-modules recompute their forward in backward.
template <class P>
concept checkpointing_policy =
    policy_basics<P> && std::same_as<typename P::axis, axis::checkpointing> &&
    requires(P& p, torch::nn::Module& model) {
      p.apply(model);
    };

// sharding: where parameters, gradients and optimizer state live, and the collectives.
template <class P>
concept sharding_policy =
    policy_basics<P> && std::same_as<typename P::axis, axis::sharding> &&
    requires(P& p, const P& cp, torch::nn::Module& model, bool flag, const torch::Tensor& t) {
      { cp.rank() } -> std::convertible_to<std::int64_t>;
      { cp.world_size() } -> std::convertible_to<std::int64_t>;
      p.prepare(model);
      p.no_sync();                                       // RAII scope: backward without gradient sync
      p.finish_backward();                               // after backward on a sync micro-step
      { p.all_ranks_true(flag) } -> std::same_as<bool>;  // logical AND over ranks
      { p.sum_over_ranks(t) } -> std::convertible_to<torch::Tensor>;
    };
// Optional:
//   static constexpr bool averages_gradients       gradients are averaged over ranks (sample and
//                                                  token counts are then averaged alike)
//   static constexpr bool distributed              needs a process group (`kiln launch`)
//   void attach(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& compensations)
//   void after_optimizer_step(std::int64_t step, std::int64_t total_steps, std::vector<torch::Tensor>& params)
//                                                  synchronises parameters rather than gradients (local SGD)
//   optimizer_shards(named, elementwise), before_optimizer_step(), gather_optimizer_state(state, prefix),
//   shard_optimizer_state(state, prefix)           shards the optimizer's state over ranks (zero1;
//                                                  kiln/sharding/single.hpp says when each is called)
//   buckets(), gradient_allreduces(), parameter_averages(), collective_bytes(), allreduce_wait_s()
//                                                  what its collectives cost, written to summary.json

// optimizer: the update rule over the parameters it is attached to, and its state.
template <class P>
concept optimizer_policy =
    policy_basics<P> && std::same_as<typename P::axis, axis::optimizer> &&
    requires(P& p, const P& cp, const std::vector<std::pair<std::string, torch::Tensor>>& named, double lr) {
      p.attach(named);
      p.step();
      p.zero_grad();
      p.set_lr(lr);
      { cp.base_lr() } -> std::convertible_to<double>;
      { cp.state_bytes() } -> std::convertible_to<std::int64_t>;
    };
// Optional: void use_kahan_summation(bool) (Kahan-summed bf16 updates, for bf16-pure's kahan = true),
// std::vector<torch::Tensor> compensations() (their buffers, which the sharding policy keeps in step),
// save_state / load_state as above.

// profiler: hooks around phases and steps. `enabled == false` promises the hooks are empty,
// and the loop then does not even call them (if constexpr).
template <class P>
concept profiler_policy =
    policy_basics<P> && std::same_as<typename P::axis, axis::profiler> &&
    requires(P& p, kiln::phase ph, std::int64_t step) {
      { P::enabled } -> std::convertible_to<bool>;
      p.begin(ph);
      p.end(ph);
      p.on_step_end(step);
    };
// Optional: void attach(const profiler::profile_context&) (the model, the rank and the optimizer's
// state size, given by accelerator::prepare), void finish(const std::filesystem::path& dir) (report
// and files, called by fit() at the end), set_gradient_health(rows, warnings) (the diagnostics'
// last report, shown in it).

namespace detail {

template <class T>
struct always_false : std::false_type {};

template <class Axis, class P>
inline constexpr bool on_axis = [] {
  if constexpr (names_an_axis<P>) return std::is_same_v<typename P::axis, Axis>;
  else return false;
}();

#define KILN_DETAIL_OR_ON_AXIS(axis_name, default_policy) || on_axis<axis::axis_name, P>
template <class P>
inline constexpr bool on_known_axis = false KILN_AXES(KILN_DETAIL_OR_ON_AXIS);
#undef KILN_DETAIL_OR_ON_AXIS

// The axes' names for messages: "kiln::axis::{ precision accumulation ... }".
#define KILN_DETAIL_AXIS_NAME(axis_name, default_policy) " " #axis_name
#define KILN_DETAIL_AXIS_NAMES "kiln::axis::{" KILN_AXES(KILN_DETAIL_AXIS_NAME) " }"

// False for every P, for a static_assert that fires only where it is instantiated: in the
// branch of the first check a type fails.
template <class P>
inline constexpr bool missing = false;

// The members every policy needs, each with its own sentence. Only the first one missing is
// reported, so that a type that is no policy at all gives one error, not one per member.
template <class P>
consteval bool check_policy_basics() {
  if constexpr (!names_an_axis<P>) {
    static_assert(missing<P>, "kiln: this type is not a policy: it has no member `using axis = kiln::axis::<name>;` "
                              "(<name> one of " KILN_DETAIL_AXIS_NAMES ")");
    return false;
  } else if constexpr (!on_known_axis<P>) {
    static_assert(missing<P>, "kiln: this type is not a policy: its `axis` member is none of " KILN_DETAIL_AXIS_NAMES);
    return false;
  } else if constexpr (!has_kind<P>) {
    static_assert(missing<P>, "kiln: policy is missing `static constexpr std::string_view kind` (its TOML kind)");
    return false;
  } else if constexpr (!has_settings<P>) {
    static_assert(missing<P>, "kiln: policy is missing a default-constructible nested `settings` struct");
    return false;
  } else if constexpr (!constructible_from_settings<P>) {
    static_assert(missing<P>, "kiln: policy is missing a constructor `explicit P(const settings&)`");
    return false;
  } else {
    return true;
  }
}
#undef KILN_DETAIL_AXIS_NAMES
#undef KILN_DETAIL_AXIS_NAME

}  // namespace detail

// Checks one policy against its axis, member by member, and reports the first member missing
// (one error, one sentence). Returns whether it is complete, so that callers can stop
// instantiating further code (and further errors) when it is not.
template <class P>
consteval bool check_policy() {
  if constexpr (!detail::check_policy_basics<P>()) {
    return false;
  } else if constexpr (std::is_same_v<typename P::axis, axis::precision>) {
    if constexpr (!(requires(const P& p) { p.autocast(); })) {
      static_assert(detail::missing<P>, "kiln: precision axis: policy is missing `autocast() const` (an RAII scope around forward and loss)");
      return false;
    } else if constexpr (!(requires(const P& p, const torch::Tensor& t) { { p.scale(t) } -> std::convertible_to<torch::Tensor>; })) {
      static_assert(detail::missing<P>, "kiln: precision axis: policy is missing `torch::Tensor scale(const torch::Tensor& loss) const`");
      return false;
    } else if constexpr (!(requires(P& p, std::vector<torch::Tensor>& v) { { p.unscale_and_check(v) } -> std::same_as<bool>; })) {
      static_assert(detail::missing<P>, "kiln: precision axis: policy is missing `bool unscale_and_check(std::vector<torch::Tensor>& params)`");
      return false;
    } else if constexpr (!(requires(P& p) { p.update(true); })) {
      static_assert(detail::missing<P>, "kiln: precision axis: policy is missing `void update(bool all_finite)`");
      return false;
    } else {
      return precision_policy<P>;
    }
  } else if constexpr (std::is_same_v<typename P::axis, axis::accumulation>) {
    if constexpr (!(requires(const P& p) { { p.micro_steps() } -> std::convertible_to<std::int64_t>; })) {
      static_assert(detail::missing<P>, "kiln: accumulation axis: policy is missing `std::int64_t micro_steps() const`");
      return false;
    } else if constexpr (!(requires(const P& p) { { p.unit() } -> std::same_as<loss_unit>; })) {
      static_assert(detail::missing<P>, "kiln: accumulation axis: policy is missing `kiln::loss_unit unit() const`");
      return false;
    } else if constexpr (!(requires(P& p, const torch::Tensor& t, const rank_mean& m) { { p.normalize(t, 1.0, m) } -> std::convertible_to<torch::Tensor>; })) {
      static_assert(detail::missing<P>, "kiln: accumulation axis: policy is missing `torch::Tensor normalize(const torch::Tensor& loss, double items, const kiln::rank_mean&)`");
      return false;
    } else if constexpr (!(requires(P& p, const rank_mean& m) { { p.end_window(m) } -> std::convertible_to<double>; })) {
      static_assert(detail::missing<P>, "kiln: accumulation axis: policy is missing `double end_window(const kiln::rank_mean&)`");
      return false;
    } else {
      return accumulation_policy<P>;
    }
  } else if constexpr (std::is_same_v<typename P::axis, axis::checkpointing>) {
    if constexpr (!(requires(P& p, torch::nn::Module& m) { p.apply(m); })) {
      static_assert(detail::missing<P>, "kiln: checkpointing axis: policy is missing `void apply(torch::nn::Module& model)`");
      return false;
    } else {
      return checkpointing_policy<P>;
    }
  } else if constexpr (std::is_same_v<typename P::axis, axis::sharding>) {
    if constexpr (!(requires(const P& p) { { p.rank() } -> std::convertible_to<std::int64_t>; })) {
      static_assert(detail::missing<P>, "kiln: sharding axis: policy is missing `std::int64_t rank() const`");
      return false;
    } else if constexpr (!(requires(const P& p) { { p.world_size() } -> std::convertible_to<std::int64_t>; })) {
      static_assert(detail::missing<P>, "kiln: sharding axis: policy is missing `std::int64_t world_size() const`");
      return false;
    } else if constexpr (!(requires(P& p, torch::nn::Module& m) { p.prepare(m); })) {
      static_assert(detail::missing<P>, "kiln: sharding axis: policy is missing `void prepare(torch::nn::Module& model)`");
      return false;
    } else if constexpr (!(requires(P& p) { p.no_sync(); })) {
      static_assert(detail::missing<P>, "kiln: sharding axis: policy is missing `no_sync()` (an RAII scope that suspends gradient sync)");
      return false;
    } else if constexpr (!(requires(P& p) { p.finish_backward(); })) {
      static_assert(detail::missing<P>, "kiln: sharding axis: policy is missing `void finish_backward()`");
      return false;
    } else if constexpr (!(requires(P& p) { { p.all_ranks_true(true) } -> std::same_as<bool>; })) {
      static_assert(detail::missing<P>, "kiln: sharding axis: policy is missing `bool all_ranks_true(bool)`");
      return false;
    } else if constexpr (!(requires(P& p, const torch::Tensor& t) { { p.sum_over_ranks(t) } -> std::convertible_to<torch::Tensor>; })) {
      static_assert(detail::missing<P>, "kiln: sharding axis: policy is missing `torch::Tensor sum_over_ranks(const torch::Tensor&)`");
      return false;
    } else {
      return sharding_policy<P>;
    }
  } else if constexpr (std::is_same_v<typename P::axis, axis::optimizer>) {
    if constexpr (!(requires(P& p, const std::vector<std::pair<std::string, torch::Tensor>>& n) { p.attach(n); })) {
      static_assert(detail::missing<P>, "kiln: optimizer axis: policy is missing `void attach(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters)`");
      return false;
    } else if constexpr (!(requires(P& p) { p.step(); })) {
      static_assert(detail::missing<P>, "kiln: optimizer axis: policy is missing `void step()`");
      return false;
    } else if constexpr (!(requires(P& p) { p.zero_grad(); })) {
      static_assert(detail::missing<P>, "kiln: optimizer axis: policy is missing `void zero_grad()`");
      return false;
    } else if constexpr (!(requires(P& p) { p.set_lr(1.0); })) {
      static_assert(detail::missing<P>, "kiln: optimizer axis: policy is missing `void set_lr(double)`");
      return false;
    } else if constexpr (!(requires(const P& p) { { p.base_lr() } -> std::convertible_to<double>; })) {
      static_assert(detail::missing<P>, "kiln: optimizer axis: policy is missing `double base_lr() const`");
      return false;
    } else if constexpr (!(requires(const P& p) { { p.state_bytes() } -> std::convertible_to<std::int64_t>; })) {
      static_assert(detail::missing<P>, "kiln: optimizer axis: policy is missing `std::int64_t state_bytes() const`");
      return false;
    } else {
      return optimizer_policy<P>;
    }
  } else {
    if constexpr (!(requires { { P::enabled } -> std::convertible_to<bool>; })) {
      static_assert(detail::missing<P>, "kiln: profiler axis: policy is missing `static constexpr bool enabled`");
      return false;
    } else if constexpr (!(requires(P& p, kiln::phase ph) { p.begin(ph); p.end(ph); })) {
      static_assert(detail::missing<P>, "kiln: profiler axis: policy is missing `void begin(kiln::phase)` / `void end(kiln::phase)`");
      return false;
    } else if constexpr (!(requires(P& p, std::int64_t s) { p.on_step_end(s); })) {
      static_assert(detail::missing<P>, "kiln: profiler axis: policy is missing `void on_step_end(std::int64_t step)`");
      return false;
    } else {
      return profiler_policy<P>;
    }
  }
}

}  // namespace kiln
