// kiln/accelerator.hpp: the loop you write yourself, with kiln's policies doing the rest
// (the shape of Hugging Face Accelerate).
//
//   kiln::accelerator<kiln::optim::adamw> acc({.optimizer = {.lr = 1e-3}});
//   acc.prepare(*model);
//   for (auto& [x, y] : batches) {
//     auto micro = acc.accumulate();          // one micro-step; steps the optimizer at scope end
//     torch::Tensor loss;                      // when this micro-step completes a window
//     x = acc.place(x), y = acc.place(y);      // onto the model's device (settings.device)
//     { auto cast = acc.autocast(); loss = torch::cross_entropy_loss(model->forward(x), y); }
//     acc.backward(loss);
//   }
//
// Without accumulate(), call acc.step() after every backward(): it steps the optimizer only
// on the last micro-step of each accumulation window. kiln::trainer is built on this class.
//
// With a profiler policy (kiln::profiler::profile<...>), backward() and step() time their own
// phases and end the profiler's step; mark the others with `auto p = acc.phase(kiln::phase::data);`
// and call `acc.profiler().finish(dir)` at the end for the report. kiln::diagnostics
// (kiln/diagnostics.hpp) works on such a loop the same way.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/device.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"
#include "kiln/policies.hpp"
#include "kiln/settings/fields.hpp"
#include "kiln/schedule.hpp"

namespace kiln {

// What one call of step() did.
struct step_result {
  bool stepped = false;     // the optimizer ran (a sync micro-step with finite gradients)
  bool skipped = false;     // a sync micro-step whose gradients were not finite: no update
  double lr = 0.0;          // the lr the optimizer used
  double grad_norm = -1.0;  // global gradient norm before clipping; -1 when not measured
};

namespace detail {
// A precision policy that never skips a step says so (`static constexpr bool always_finite =
// true`), and the ranks need not agree on it every step.
template <class P>
inline constexpr bool always_finite = requires { requires P::always_finite; };

// An optimizer whose update is elementwise says so (`static constexpr bool elementwise_update =
// true`): its state can then be split by rows over ranks (sharding::zero1).
template <class Optimizer>
constexpr bool elementwise_update() {
  return requires { requires Optimizer::elementwise_update; };
}

// A profiler phase as a scope; nothing at all under a profiler that is not enabled.
template <class Profiler>
class phase_scope {
 public:
  phase_scope(Profiler& profiler, kiln::phase p) : profiler_(profiler), phase_(p) { profiler_.begin(phase_); }
  phase_scope(const phase_scope&) = delete;
  phase_scope& operator=(const phase_scope&) = delete;
  ~phase_scope() { profiler_.end(phase_); }

 private:
  Profiler& profiler_;
  kiln::phase phase_;
};
struct no_phase_scope {
  ~no_phase_scope() {}  // not trivial: `auto scope = acc.phase(...)` is not an unused variable
};
}  // namespace detail

// Whether an accumulation policy skips an epoch's last, short window (its optional
// drop_partial_window()) rather than stepping over what it holds.
template <class Accumulation>
bool drops_partial_window(const Accumulation& policy) {
  if constexpr (requires { policy.drop_partial_window(); }) return policy.drop_partial_window();
  else return false;
}

// Optimizer steps in an epoch of `batches` micro-batches, as accelerator::plan_window makes
// them: an epoch's last, shorter window counts when it is stepped, not when the policy drops it.
// 0 when the policy drops every window (fewer batches than one window holds).
template <class Accumulation>
std::int64_t optimizer_steps_per_epoch(const Accumulation& policy, std::int64_t batches) {
  const std::int64_t n = policy.micro_steps();
  return drops_partial_window(policy) ? batches / n : (batches + n - 1) / n;
}

// How the next accumulation window is made (accelerator::plan_window).
struct window_plan {
  std::int64_t micro_batches = 1;   // micro-batches in it
  bool skip_rest_of_epoch = false;  // take them from the next epoch: this one's rest is too short
};

template <class... Ps>
class accelerator {
 public:
  using policies = policy_pack<Ps...>;
  // Per axis (kiln/axes.hpp) a type, a settings member, a policy member and its accessor:
  // precision_t, settings::precision, precision_ and precision(); optimizer_t, ...
#define KILN_DETAIL_POLICY_TYPE(axis_name, default_policy) using axis_name##_t = typename policies::axis_name;
  KILN_AXES(KILN_DETAIL_POLICY_TYPE)
#undef KILN_DETAIL_POLICY_TYPE

  // One member per axis, each the policy's own settings struct, plus what belongs to no axis.
  struct settings {
#define KILN_DETAIL_SETTINGS_MEMBER(axis_name, default_policy) typename axis_name##_t::settings axis_name{};
    KILN_AXES(KILN_DETAIL_SETTINGS_MEMBER)
#undef KILN_DETAIL_SETTINGS_MEMBER
    schedule scheduler{};          // kiln/schedule.hpp: e.g. kiln::schedules::cosine{.warmup_steps = 100}
    double clip_grad_norm = 0.0;   // max global L2 norm of the gradients; 0 = no clipping
    std::int64_t total_steps = 0;  // optimizer steps in the run, for decaying schedules
    std::string device = "auto";   // kiln/device.hpp: "auto", "cpu", "cuda" or "cuda:N"
  };

  // Settings built in C++ get the checks a recipe's get, in the same words ("optimizer.lr = -1:
  // expected a value > 0"); a recipe's were checked when it was read, and pass again.
  static settings checked(settings s) {
    std::vector<std::string> errors;
    auto check = [&errors]<class Part>(Part& part, std::string_view table) {
      if constexpr (requires(detail::check_visitor v) { part.describe(v); })
        for (auto& e : kiln::validate(part, std::string(table))) errors.push_back(std::move(e));
    };
#define KILN_DETAIL_CHECK(axis_name, default_policy) check(s.axis_name, axis::axis_name::name);
    KILN_AXES(KILN_DETAIL_CHECK)
#undef KILN_DETAIL_CHECK
    check(s.scheduler, "scheduler");
    if (auto e = checks::non_negative(s.clip_grad_norm))
      errors.push_back("train.clip_grad_norm = " + detail::value_text(s.clip_grad_norm) + ": " + *e);
    throw_if_invalid(errors);
    return s;
  }

  explicit accelerator(settings s = {})
      : settings_(checked(std::move(s))),
#define KILN_DETAIL_INIT(axis_name, default_policy) axis_name##_(settings_.axis_name),
        KILN_AXES(KILN_DETAIL_INIT)
#undef KILN_DETAIL_INIT
        device_(resolve_device(settings_.device)),
        window_(accumulation_.micro_steps()) {
    // A precision policy that depends on the device (fp16: CUDA, or a CPU autocast with float16)
    // learns it here, and refuses one it cannot run on before anything trains.
    if constexpr (requires { precision_.use_device(device_); }) precision_.use_device(device_);
  }

  // Moves the model to the device, wraps checkpointed blocks, places (or shards) the
  // parameters, then builds the optimizer over them: the order of DESIGN.md's step lifecycle.
  void prepare(torch::nn::Module& model) {
    model.to(device_);
    checkpointing_.apply(model);
    sharding_.prepare(model);
    named_params_.clear();
    params_.clear();
    for (const auto& item : model.named_parameters(/*recurse=*/true))
      if (item.value().requires_grad()) named_params_.emplace_back(item.key(), item.value());
    // A precision policy may keep the weights the optimizer updates apart from the model's
    // (bf16-pure: fp32 masters of bf16 parameters).
    if constexpr (requires { precision_.prepare(model, named_params_); })
      named_params_ = precision_.prepare(model, named_params_);
    for (const auto& [name, p] : named_params_) params_.push_back(p);
    if constexpr (requires { precision_.kahan_summation(); })
      if (precision_.kahan_summation()) {
        if constexpr (requires { optimizer_.use_kahan_summation(true); })
          optimizer_.use_kahan_summation(true);
        else
          throw config_error("precision.kahan = true: the optimizer \"" + std::string(optimizer_t::kind) +
                             "\" has no Kahan-summed bf16 updates (`void use_kahan_summation(bool)`; kiln's sgd, "
                             "adamw, lion, adafactor and adam8bit have them); use kahan = false for fp32 master weights");
      }
    // A sharding policy that shards the optimizer's state (zero1) attaches it to this rank's
    // shard of each weight.
    if constexpr (requires { sharding_.optimizer_shards(named_params_, true); })
      optimizer_.attach(sharding_.optimizer_shards(named_params_, detail::elementwise_update<optimizer_t>()));
    else
      optimizer_.attach(named_params_);
    // The sharding policy's buckets follow what the precision policy made of the parameters, and
    // what the optimizer keeps beside them (Kahan compensations under bf16-pure's kahan = true).
    if constexpr (requires { sharding_.attach(params_, params_); }) {
      std::vector<torch::Tensor> compensations(params_.size());
      if constexpr (requires { optimizer_.compensations(); }) compensations = optimizer_.compensations();
      sharding_.attach(params_, compensations);
    }
    // Where the sharding policy averages gradients over ranks, sample and token counts are
    // averaged alike (kiln/accumulation/steps.hpp says why).
    if constexpr (requires { sharding_t::averages_gradients; })
      if (sharding_t::averages_gradients && sharding_.world_size() > 1)
        gradient_rank_mean_ = [this](double count) {
          const auto total = sharding_.sum_over_ranks(torch::full({1}, count, torch::kFloat64));
          return total.template item<double>() / static_cast<double>(sharding_.world_size());
        };
    micro_ = 0;
    window_ = accumulation_.micro_steps();
    if constexpr (requires { profiler_.attach(profiler::profile_context{}); })
      profiler_.attach({&model, rank(), [this] { return optimizer_.state_bytes(); }});
  }
  template <class M>
  void prepare(torch::nn::ModuleHolder<M>& model) {
    prepare(*model);
  }

  // Where the model lives; place() moves a batch there (asynchronously from pinned memory).
  const torch::Device& device() const { return device_; }
  torch::Tensor place(const torch::Tensor& t) const { return to_device(t, device_); }

  // The precision policy's autocast scope; keep forward and loss inside it.
  auto autocast() const { return precision_.autocast(); }

  // The profiler's phase `p` as a scope, for the phases only the loop sees (data, forward).
  [[nodiscard]] auto phase(kiln::phase p) {
    if constexpr (profiler_t::enabled) return detail::phase_scope<profiler_t>(profiler_, p);
    else return detail::no_phase_scope{};
  }

  // True when the current micro-step is the last of its accumulation window: its backward
  // synchronises gradients and the following step() updates the parameters.
  bool is_sync_step() const { return micro_ == window_ - 1; }

  // The window that starts now, with `batches_left` micro-batches left in the loader's epoch: the
  // policy's N, or an epoch's last, shorter window, stepped over what it holds (begun here) or,
  // where the policy drops it, skipped (the N then come from the next epoch). The one place that
  // decides a window's length; kiln::optimizer_steps_per_epoch() counts what it decides.
  window_plan plan_window(std::int64_t batches_left) {
    const auto n = accumulation_.micro_steps();
    if (batches_left <= 0 || batches_left >= n) return {n, false};
    if (drops_partial_window(accumulation_)) return {n, true};
    begin_window(batches_left);
    return {batches_left, false};
  }

  // Makes the window that starts now `micro_batches` long instead of the policy's N: an
  // epoch's last, shorter window. Its gradient is still normalised over what it holds.
  void begin_window(std::int64_t micro_batches) {
    if (micro_ != 0) throw config_error("accelerator: begin_window() called in the middle of a window");
    if (micro_batches < 1 || micro_batches > accumulation_.micro_steps())
      throw config_error("accelerator: a window of " + std::to_string(micro_batches) +
                         " micro-batches; expected 1 to " + std::to_string(accumulation_.micro_steps()));
    window_ = micro_batches;
  }

  // `loss` is the mean over `items` of the accumulation policy's unit (samples or tokens; left
  // at 1 when the policy normalises by micro-batches).
  void backward(const torch::Tensor& loss, double items = 1.0) {
    {
      auto timed = phase(kiln::phase::backward);
      auto scaled = precision_.scale(accumulation_.normalize(loss, items, gradient_rank_mean_));
      if (!is_sync_step()) {
        auto no_sync = sharding_.no_sync();
        scaled.backward();
        return;
      }
      scaled.backward();
    }
    // The gradient synchronisation backward did not hide (ddp: waiting for its all-reduces) is
    // the profiler's communication phase, where there are ranks to communicate with.
    if constexpr (requires { requires sharding_t::distributed; }) {
      auto timed = phase(kiln::phase::communication);
      sharding_.finish_backward();
    } else {
      sharding_.finish_backward();
    }
  }

  // Ends a micro-step; on the last one of a window: unscale, agree on finiteness across
  // ranks, clip, schedule, update, zero the gradients.
  step_result step() {
    step_result result;
    if (!is_sync_step()) {
      ++micro_;
      return last_ = result;
    }
    micro_ = 0;
    window_ = accumulation_.micro_steps();
    {
      auto timed = phase(kiln::phase::optimizer);
      // Uneven micro-batches (or ranks) under sample/token normalisation; exactly 1.0 otherwise.
      if (const double correction = accumulation_.end_window(gradient_rank_mean_); correction != 1.0)
        for (auto& p : params_)
          if (p.grad().defined()) p.grad().mul_(correction);
      bool finite = precision_.unscale_and_check(params_);
      // Every rank must skip the same steps: one small all-reduce, unless the precision policy
      // can never skip one.
      if constexpr (!detail::always_finite<precision_t>) finite = sharding_.all_ranks_true(finite);
      precision_.update(finite);
      result.lr = optimizer_.base_lr() * settings_.scheduler.factor(step_, settings_.total_steps);
      if (finite) {
        if (settings_.clip_grad_norm > 0)
          result.grad_norm = torch::nn::utils::clip_grad_norm_(params_, settings_.clip_grad_norm);
        optimizer_.set_lr(result.lr);
        if constexpr (requires { sharding_.before_optimizer_step(); }) sharding_.before_optimizer_step();
        optimizer_.step();
        result.stepped = true;
      } else {
        result.skipped = true;
      }
      optimizer_.zero_grad();
      ++step_;  // skipped steps count too: the schedule follows windows, as with GradScaler
    }
    // Sharding that synchronises parameters after the step (local SGD's average, zero1's
    // all-gather) does it here, on the weights the optimizer updates (bf16-pure's fp32 masters,
    // not their rounding in the model) ...
    if constexpr (requires { sharding_.after_optimizer_step(step_, settings_.total_steps, params_); }) {
      auto timed = phase(kiln::phase::communication);
      sharding_.after_optimizer_step(step_, settings_.total_steps, params_);
    }
    // ... and a precision policy that keeps its own weights rounds them into the model after that.
    if constexpr (requires { precision_.after_step(); }) {
      auto timed = phase(kiln::phase::optimizer);
      precision_.after_step();
    }
    if constexpr (profiler_t::enabled) profiler_.on_step_end(step_);
    return last_ = result;
  }

  // One micro-step as a scope: backward() inside it, step() at its end.
  class micro_step {
   public:
    explicit micro_step(accelerator& acc) : acc_(&acc), sync_(acc.is_sync_step()) {}
    micro_step(const micro_step&) = delete;
    micro_step& operator=(const micro_step&) = delete;
    ~micro_step() noexcept(false) {
      if (std::uncaught_exceptions() == 0) acc_->step();
    }
    bool sync() const { return sync_; }

   private:
    accelerator* acc_;
    bool sync_;
  };
  [[nodiscard]] micro_step accumulate() { return micro_step(*this); }

  // Completed accumulation windows (optimizer steps, including ones skipped on overflow).
  std::int64_t optimizer_steps() const { return step_; }
  const step_result& last_step() const { return last_; }

  bool is_main() const { return sharding_.rank() == 0; }
  std::int64_t rank() const { return sharding_.rank(); }
  std::int64_t world_size() const { return sharding_.world_size(); }
  torch::Tensor sum_over_ranks(const torch::Tensor& t) { return sharding_.sum_over_ranks(t); }

  // Whether save_state() is a collective that every rank must call (the optimizer's state is
  // sharded over ranks, and gathered to be saved whole); otherwise rank 0's alone is the state.
  static constexpr bool saves_collectively =
      requires(sharding_t& s, state_dict& d, const std::string& prefix) { s.gather_optimizer_state(d, prefix); };

  // Everything the accelerator and its policies need to continue exactly where they were.
  void save_state(state_dict& state) {
    state["accelerator/step"] = scalar_tensor(step_);
    save_policy_state(precision_, state, "precision/");
    save_policy_state(accumulation_, state, "accumulation/");
    save_policy_state(optimizer_, state, "optim/");
    if constexpr (saves_collectively) sharding_.gather_optimizer_state(state, "optim/");
  }
  void load_state(const state_dict& state) {
    step_ = require(state, "accelerator/step").template item<std::int64_t>();
    micro_ = 0;
    window_ = accumulation_.micro_steps();
    load_policy_state(precision_, state, "precision/");
    load_policy_state(accumulation_, state, "accumulation/");
    if constexpr (requires { sharding_.shard_optimizer_state(state, std::string()); })
      load_policy_state(optimizer_, sharding_.shard_optimizer_state(state, "optim/"), "optim/");
    else
      load_policy_state(optimizer_, state, "optim/");
  }

  const settings& config() const { return settings_; }
#define KILN_DETAIL_ACCESSOR(axis_name, default_policy) \
  axis_name##_t& axis_name() { return axis_name##_; }
  KILN_AXES(KILN_DETAIL_ACCESSOR)
#undef KILN_DETAIL_ACCESSOR
  const std::vector<torch::Tensor>& parameters() const { return params_; }

 private:
  template <class P>
  static void save_policy_state(const P& p, state_dict& state, const std::string& prefix) {
    if constexpr (requires { p.save_state(state, prefix); }) p.save_state(state, prefix);
  }
  template <class P>
  static void load_policy_state(P& p, const state_dict& state, const std::string& prefix) {
    if constexpr (requires { p.load_state(state, prefix); }) p.load_state(state, prefix);
  }

  settings settings_;
#define KILN_DETAIL_POLICY_MEMBER(axis_name, default_policy) axis_name##_t axis_name##_;
  KILN_AXES(KILN_DETAIL_POLICY_MEMBER)
#undef KILN_DETAIL_POLICY_MEMBER
  torch::Device device_;

  std::vector<std::pair<std::string, torch::Tensor>> named_params_;
  std::vector<torch::Tensor> params_;
  rank_mean gradient_rank_mean_;  // empty unless gradients are averaged over several ranks
  std::int64_t micro_ = 0;  // index of the current micro-step within its window
  std::int64_t window_;      // micro-steps in the current window (the policy's N but at epoch ends)
  std::int64_t step_ = 0;   // completed accumulation windows
  step_result last_{};
};

}  // namespace kiln
