// kiln/diagnostics.hpp: what went wrong inside the model, and where.
//
// A loss that turns NaN or a run that stops learning says nothing about which layer is to
// blame. diagnostics answers that around the training step: per-module gradient norms,
// parameter norms and update ratios every `every` steps, warnings for exploding, vanishing
// and non-finite gradients that name the module, and an anomaly mode that stops at the first
// non-finite forward output or gradient and names its module and op.
//
//   kiln::diagnostics diag({.every = 100});
//   diag.attach(model);                                  // after prepare
//   { auto watch = diag.watch_forward(step); loss = loss_fn(model->forward(x), y); }
//   loss.backward();
//   diag.after_backward(step);                           // before optimizer.step()
//   optimizer.step();
//   diag.after_step(step);
//
// LibTorch's C++ modules have no forward hooks, so forward outputs are observed through
// ATen's RecordFunction and attributed to a module by the parameters among an op's inputs.
// Nothing is installed and nothing is computed on steps that are neither due nor anomaly.
#pragma once

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/errors.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln {

struct diagnostics_settings {
  std::int64_t every = 0;          // optimizer steps between gradient reports; 0 = off
  bool anomaly = false;            // check every op's output every step; stop at the first non-finite value
  double explode_threshold = 1e3;  // per-layer grad norm above this: "exploding" warning
  double vanish_threshold = 1e-7;  // per-layer grad norm below this (and > 0 params): "vanishing" warning

  template <class V>
  void describe(V& v) {
    v.field("every", every, "optimizer steps between per-layer gradient reports; 0 disables them",
            checks::non_negative);
    v.field("anomaly", anomaly,
            "check every op output and gradient on every step and stop at the first non-finite value (slow)");
    v.field("explode_threshold", explode_threshold, "per-layer gradient norm above which a layer is reported as exploding",
            checks::positive);
    v.field("vanish_threshold", vanish_threshold, "per-layer gradient norm below which a layer is reported as vanishing",
            checks::non_negative);
  }
};

// One module's numbers at a reported step; norms aggregate all of the module's own parameters.
struct layer_health {
  std::string module;
  double grad_norm = 0.0;
  double param_norm = 0.0;      // before the optimizer step
  double update_ratio = -1.0;   // ||p_after - p_before|| / ||p_before||; -1 if unknown
  bool finite = true;           // every gradient and parameter value of the module is finite
};

struct non_finite_report {
  std::string module;     // "" when no module had been seen yet in that forward
  std::string op;         // the ATen op for a forward output; "" for a gradient
  std::string where;      // "forward output" | "gradient"
  std::int64_t step = 0;
  std::string parameter;  // for a gradient: the parameter ("layers.2.weight")
  bool inferred = false;  // forward output of an op without parameter inputs: the module is the one before it

  std::string text() const {
    std::string out = (where == "gradient" ? "non-finite " : "NaN in ") + where;
    if (where == "gradient" && !parameter.empty()) {
      out += " of parameter " + parameter + " (module " + module + ")";
    } else {
      if (module.empty()) out += " before any module";
      else out += (inferred ? " after module " : " of module ") + module;
      if (!op.empty()) out += " (" + op + ")";
    }
    return out + " at step " + std::to_string(step);
  }
};

// Where a forward threw: the op the model's forward called (aten::mm, not the ops inside it),
// and the module whose parameters it took, or the last module before it.
struct failure_site {
  std::string module;     // "" when no module's parameters had been used yet
  std::string op;         // "" when the exception came from the forward's own code, between ops
  bool inferred = false;  // no parameter among the op's inputs: module is the one before it

  std::string text() const {
    std::string out = op.empty() ? std::string("between ops") : "in " + op;
    if (!module.empty()) out += (inferred ? " after module " : " of module ") + module;
    return out;
  }
};

// Thrown in anomaly mode at the first non-finite forward output or gradient.
struct anomaly_error : error {
  using error::error;
};

namespace detail {

// Reduced-precision norms overflow long before the values are non-finite.
inline torch::Tensor squared_norm(const torch::Tensor& t) {
  auto x = t.detach();
  if (x.is_floating_point() && x.element_size() < 4) x = x.to(torch::kFloat);
  return x.norm().pow(2).to(torch::kDouble);
}

inline bool checkable(const torch::Tensor& t) {
  return t.defined() && t.layout() == torch::kStrided && t.has_storage() &&
         (t.is_floating_point() || t.is_complex()) && t.numel() > 0;
}

// One copy to the host for many 0-dim flags or norms instead of one sync each.
inline std::vector<double> to_host(const std::vector<torch::Tensor>& values) {
  if (values.empty()) return {};
  const auto device = values.front().device();
  std::vector<torch::Tensor> same;
  same.reserve(values.size());
  for (const auto& v : values) same.push_back(v.to(device, torch::kDouble).reshape({}));
  auto host = torch::stack(same).cpu().contiguous();
  const double* p = host.data_ptr<double>();
  return std::vector<double>(p, p + host.numel());
}

// RecordFunction::inputs() asserts a flag that exists only when NDEBUG is undefined. The
// library is built with NDEBUG, so in a consumer built without it the flag is uninitialised
// padding and inputs() throws at random. Debug builds therefore read the member directly,
// through the one construct that may name a private member: an explicit instantiation.
// (Repeated in every including TU; GCC, Clang and MSVC merge these like any instantiation.)
#ifndef NDEBUG
using record_function_inputs = c10::ArrayRef<const c10::IValue> at::RecordFunction::*;
struct record_function_inputs_tag {
  friend record_function_inputs inputs_member(record_function_inputs_tag);
};
template <class Tag, record_function_inputs Member>
struct record_function_inputs_access {
  friend record_function_inputs inputs_member(Tag) { return Member; }
};
template struct record_function_inputs_access<record_function_inputs_tag, &at::RecordFunction::inputs_>;
inline c10::ArrayRef<const c10::IValue> op_inputs(const at::RecordFunction& fn) {
  return fn.*inputs_member(record_function_inputs_tag{});
}
#else
inline c10::ArrayRef<const c10::IValue> op_inputs(const at::RecordFunction& fn) { return fn.inputs(); }
#endif

}  // namespace detail

class diagnostics {
  struct forward_state;

 public:
  using activation_hook = std::function<void(const std::string& module, const std::string& op, const torch::Tensor& output)>;
  using gradient_hook = std::function<void(const std::string& parameter, const torch::Tensor& grad)>;

  // Keeps op-output checks on for the current thread while alive. Destroying it (or close())
  // evaluates what was seen; in anomaly mode it then throws anomaly_error, unless an exception
  // is already unwinding through it. It must not outlive the diagnostics that made it.
  class forward_watch {
   public:
    forward_watch() = default;
    forward_watch(const forward_watch&) = delete;
    forward_watch& operator=(const forward_watch&) = delete;
    forward_watch(forward_watch&& other) noexcept
        : state_(std::move(other.state_)), handle_(std::exchange(other.handle_, 0)),
          exceptions_at_start_(other.exceptions_at_start_) {}
    forward_watch& operator=(forward_watch&&) = delete;
    ~forward_watch() noexcept(false) {
      if (!state_) return;
      // Throwing while another exception unwinds would terminate the program.
      if (std::uncaught_exceptions() > exceptions_at_start_) {
        release();
        return;
      }
      close();
    }

    // Whether this scope installed a callback (anomaly or a due step).
    bool active() const { return state_ != nullptr; }

    // Ends the scope now: removes the callback, records the first non-finite output and, in
    // anomaly mode, throws. A second call does nothing.
    void close() {
      if (!state_) return;
      auto state = release();
      state->owner->finish_forward(*state);
    }

   private:
    friend class diagnostics;
    forward_watch(std::unique_ptr<forward_state> state)
        : state_(std::move(state)), exceptions_at_start_(std::uncaught_exceptions()) {
      state_->previous = current_state();
      current_state() = state_.get();
      // Thread-local: forward ops run on the calling thread, while autograd's engine threads
      // (backward) and other threads' forwards must not pay for the checks.
      handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&diagnostics::on_op_start, &diagnostics::on_op_end)
                                               .needsInputs(true)
                                               .needsOutputs(true)
                                               .scopes({at::RecordScope::FUNCTION}));
    }

    std::unique_ptr<forward_state> release() {
      if (handle_ != 0) at::removeCallback(handle_);
      handle_ = 0;
      if (current_state() == state_.get()) current_state() = state_->previous;
      return std::move(state_);
    }

    std::unique_ptr<forward_state> state_;
    at::CallbackHandle handle_ = 0;
    int exceptions_at_start_ = 0;
  };

  explicit diagnostics(diagnostics_settings s = {}) : settings_(kiln::checked(std::move(s), "diagnostics")) {}

  diagnostics(const diagnostics&) = delete;
  diagnostics& operator=(const diagnostics&) = delete;

  // Call once, after the model is on its device: remembers the parameters and their modules.
  void attach(torch::nn::Module& model) {
    params_.clear();
    modules_.clear();
    std::unordered_map<std::string, std::size_t> module_index;
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      const auto& name = item.key();
      const auto dot = name.rfind('.');
      std::string module = dot == std::string::npos ? std::string() : name.substr(0, dot);
      auto [it, added] = module_index.emplace(module, modules_.size());
      if (added) modules_.push_back(module);
      params_.push_back({name, it->second, item.value()});
    }
    attached_ = true;
  }

  const diagnostics_settings& settings() const { return settings_; }

  bool due(std::int64_t step) const { return settings_.every > 0 && step % settings_.every == 0; }

  // Active only when anomaly or due(step); otherwise it installs nothing and costs nothing.
  [[nodiscard]] forward_watch watch_forward(std::int64_t step) {
    if (!attached_ || !(settings_.anomaly || due(step))) return forward_watch();
    return forward_watch(new_forward_state(step));
  }

  // Runs a forward that threw once more, observing every op it calls, and says where it
  // throws this time; nullopt if it does not throw again. Run only after a failure, so that
  // a forward that succeeds pays nothing; the model's own state (batch-norm statistics, the
  // RNG) moves on as if a step had been taken, which is fine for a run about to stop.
  static std::optional<failure_site> locate_failure(torch::nn::Module& model, const std::function<void()>& forward) {
    diagnostics locator;
    locator.attach(model);
    auto state = locator.new_forward_state(0);
    state->locating = true;
    auto* seen = state.get();
    forward_watch watch(std::move(state));
    try {
      forward();
    } catch (...) {
      if (!seen->failure && seen->recent_module)  // thrown by the forward's own code, after its last op
        seen->failure = failure_site{locator.modules_[*seen->recent_module], "", true};
      auto found = seen->failure;
      watch.release();
      return found;
    }
    watch.release();
    return std::nullopt;
  }

  // After backward on the micro-step that synchronises gradients, before the optimizer step.
  void after_backward(std::int64_t step) {
    const bool report = due(step);
    if (!attached_ || !(report || settings_.anomaly)) return;
    torch::NoGradGuard no_grad;

    // Backward order (output side first), so the first non-finite gradient is the one nearest
    // the output, where a NaN born in the backward usually shows first.
    std::vector<std::size_t> order;
    std::vector<torch::Tensor> grad_flags;
    for (std::size_t i = params_.size(); i-- > 0;) {
      const auto& grad = params_[i].value.grad();
      if (!detail::checkable(grad)) continue;
      for (auto& hook : gradient_hooks_) hook(params_[i].name, grad);
      order.push_back(i);
      grad_flags.push_back(torch::isfinite(grad).all());
    }
    std::vector<torch::Tensor> values = grad_flags;
    std::vector<torch::Tensor> param_flags, grad_sq, param_sq;
    if (report) {
      for (auto i : order) grad_sq.push_back(detail::squared_norm(params_[i].value.grad()));
      for (const auto& p : params_) {
        param_sq.push_back(detail::squared_norm(p.value));
        param_flags.push_back(torch::isfinite(p.value).all());
      }
      values.insert(values.end(), grad_sq.begin(), grad_sq.end());
      values.insert(values.end(), param_sq.begin(), param_sq.end());
      values.insert(values.end(), param_flags.begin(), param_flags.end());
    }
    const auto host = detail::to_host(values);

    std::optional<non_finite_report> found;
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (host[k] != 0.0) continue;
      const auto& p = params_[order[k]];
      found = non_finite_report{modules_[p.module], "", "gradient", step, p.name, false};
      break;
    }
    if (found && !first_) first_ = found;

    if (report) {
      std::vector<layer_health> layers(modules_.size());
      std::vector<double> grad_total(modules_.size(), 0.0), param_total(modules_.size(), 0.0);
      for (std::size_t m = 0; m < modules_.size(); ++m) layers[m].module = modules_[m];
      std::size_t at = order.size();
      for (std::size_t k = 0; k < order.size(); ++k) {
        const auto m = params_[order[k]].module;
        if (host[k] == 0.0) layers[m].finite = false;
        grad_total[m] += host[at + k];
      }
      at += order.size();
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const auto m = params_[i].module;
        param_total[m] += host[at + i];
        if (host[at + params_.size() + i] == 0.0) layers[m].finite = false;
      }
      for (std::size_t m = 0; m < modules_.size(); ++m) {
        layers[m].grad_norm = std::sqrt(grad_total[m]);
        layers[m].param_norm = std::sqrt(param_total[m]);
        if (!std::isfinite(layers[m].grad_norm)) layers[m].finite = false;
      }
      report_ = std::move(layers);
      report_step_ = step;
      // Kept only until after_step: a copy of the parameters for one step in every `every`.
      before_.clear();
      before_.reserve(params_.size());
      for (const auto& p : params_) before_.push_back(p.value.detach().clone());
      before_step_ = step;
    }

    if (found && settings_.anomaly) throw anomaly_error(found->text());
  }

  // After the optimizer step: fills update_ratio for the report made by after_backward.
  void after_step(std::int64_t step) {
    if (!attached_ || !due(step) || before_step_ != step || before_.size() != params_.size()) return;
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> delta_sq;
    delta_sq.reserve(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i)
      delta_sq.push_back(detail::squared_norm(params_[i].value.detach() - before_[i].to(params_[i].value.device())));
    const auto host = detail::to_host(delta_sq);
    std::vector<double> total(modules_.size(), 0.0);
    for (std::size_t i = 0; i < params_.size(); ++i) total[params_[i].module] += host[i];
    for (std::size_t m = 0; m < report_.size() && m < total.size(); ++m) {
      const double before_norm = report_[m].param_norm;
      report_[m].update_ratio = before_norm > 0.0 && std::isfinite(before_norm) ? std::sqrt(total[m]) / before_norm : -1.0;
    }
    before_.clear();
    before_step_ = -1;
  }

  // Per module owning parameters, in model order; empty until the first due step.
  const std::vector<layer_health>& last_report() const { return report_; }
  std::int64_t last_report_step() const { return report_step_; }

  std::vector<std::string> warnings() const {
    std::vector<std::string> out;
    const auto at_step = " at step " + std::to_string(report_step_);
    for (const auto& layer : report_) {
      const auto name = layer.module.empty() ? std::string("(model)") : layer.module;
      if (!layer.finite) {
        out.push_back("module " + name + ": non-finite gradient or parameter" + at_step);
      } else if (layer.grad_norm > settings_.explode_threshold) {
        out.push_back("module " + name + ": exploding gradient, norm " + number(layer.grad_norm) +
                      " above explode_threshold " + number(settings_.explode_threshold) + at_step);
      } else if (layer.grad_norm < settings_.vanish_threshold) {
        out.push_back("module " + name + ": vanishing gradient, norm " + number(layer.grad_norm) +
                      " below vanish_threshold " + number(settings_.vanish_threshold) + at_step);
      }
    }
    if (first_ && (report_.empty() || first_->step == report_step_)) out.push_back(first_->text());
    return out;
  }

  // The first non-finite forward output or gradient seen since construction.
  const std::optional<non_finite_report>& first_non_finite() const { return first_; }

  // Hooks run only on steps where diagnostics are active (anomaly or due), like the checks.
  // Activation hooks see the outputs of the ops the forward calls itself (aten::linear,
  // aten::relu; not the ops those are built from) in an active watch_forward scope. An op
  // without parameter inputs gets the module before it; module is "" before the first one.
  void add_activation_hook(activation_hook hook) { activation_hooks_.push_back(std::move(hook)); }
  void add_gradient_hook(gradient_hook hook) { gradient_hooks_.push_back(std::move(hook)); }

 private:
  struct param_entry {
    std::string name;
    std::size_t module;
    torch::Tensor value;
  };

  struct op_context : at::ObserverContext {
    std::int64_t depth = 0;
    std::size_t module = 0;
    bool has_module = false;
    bool inferred = false;
  };

  struct pending_check {
    torch::Tensor finite;  // 0-dim bool on the op's device, read at the end of the scope
    std::size_t module;
    bool has_module;
    bool inferred;
    std::string op;
  };

  struct forward_state {
    diagnostics* owner = nullptr;
    forward_state* previous = nullptr;
    std::int64_t step = 0;
    std::unordered_map<const c10::StorageImpl*, std::size_t> storages;
    std::optional<std::size_t> recent_module;
    std::vector<pending_check> checks;
    std::int64_t depth = 0;  // ops open on this thread inside the scope
    std::exception_ptr hook_error;
    bool locating = false;  // locate_failure: no checks, only where the exception passes
    int exceptions_at_start = 0;
    std::optional<failure_site> failure;
  };

  std::unique_ptr<forward_state> new_forward_state(std::int64_t step) {
    auto state = std::make_unique<forward_state>();
    state->owner = this;
    state->step = step;
    state->exceptions_at_start = std::uncaught_exceptions();
    // Rebuilt per scope: moving a module to a device replaces its parameters' storage.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i].value;
      if (p.defined() && p.has_storage()) state->storages.emplace(p.storage().unsafeGetStorageImpl(), params_[i].module);
    }
    return state;
  }

  static forward_state*& current_state() {
    static thread_local forward_state* state = nullptr;
    return state;
  }

  static std::string number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", value);
    return text;
  }

  static const std::size_t* parameter_module(const forward_state& state, const torch::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return nullptr;
    auto it = state.storages.find(t.storage().unsafeGetStorageImpl());
    return it == state.storages.end() ? nullptr : &it->second;
  }

  template <class F>
  static void for_each_tensor(const c10::IValue& value, F&& f) {
    if (value.isTensor()) {
      f(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) f(t);
    } else if (value.isList()) {
      for (const auto& element : value.toListRef())
        if (element.isTensor()) f(element.toTensor());
    }
  }

  static std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
    auto* state = current_state();
    if (!state) return nullptr;  // a thread that inherited the callback but not the scope
    auto ctx = std::make_unique<op_context>();
    // Only the ops the forward calls itself are observed: the ops they are built from
    // (aten::addmm's internal copy_ into its result) would report half-finished results.
    ctx->depth = state->depth++;
    if (ctx->depth > 0) return ctx;
    const std::size_t* found = nullptr;
    for (const auto& input : detail::op_inputs(fn)) {
      for_each_tensor(input, [&](const torch::Tensor& t) {
        if (!found) found = parameter_module(*state, t);
      });
      if (found) break;
    }
    if (found) {
      state->recent_module = *found;
      ctx->module = *found;
      ctx->has_module = true;
    } else if (state->recent_module) {
      ctx->module = *state->recent_module;
      ctx->has_module = true;
      ctx->inferred = true;
    }
    return ctx;
  }

  static void on_op_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
    auto* state = current_state();
    auto* ctx = static_cast<op_context*>(raw);
    if (!state || !ctx) return;
    state->depth = ctx->depth;
    if (ctx->depth > 0) return;
    if (state->locating) {
      // RecordFunction ends an op from its destructor, so an op that throws ends too, while
      // its exception unwinds: the first such op the forward called itself is the one.
      if (!state->failure && std::uncaught_exceptions() > state->exceptions_at_start) {
        const std::string no_module;
        state->failure = failure_site{ctx->has_module ? state->owner->modules_[ctx->module] : no_module,
                                      std::string(fn.name()), ctx->inferred};
      }
      return;
    }
    // The checks and hooks run ops of their own, which must not be observed in turn.
    at::RecordFunctionGuard off(false);
    torch::NoGradGuard no_grad;
    auto& self = *state->owner;
    const std::string op(fn.name());
    const std::string no_module;
    const auto& module = ctx->has_module ? self.modules_[ctx->module] : no_module;
    for (const auto& output : fn.outputs()) {
      for_each_tensor(output, [&](const torch::Tensor& t) {
        if (!t.defined()) return;
        if (!state->hook_error) {
          try {
            for (auto& hook : self.activation_hooks_) hook(module, op, t);
          } catch (...) {
            // RecordFunction would swallow it with a log line; it is rethrown at the scope's end.
            state->hook_error = std::current_exception();
          }
        }
        if (!detail::checkable(t)) return;
        // A view of a parameter (weight.t()) is the parameter, not an op's result.
        if (parameter_module(*state, t)) return;
        // NaN only: -inf is how attention masks future positions (masked_fill before softmax),
        // and an overflow to inf turns into NaN a few ops later, where it is caught.
        state->checks.push_back({torch::isnan(t.detach()).any().logical_not(), ctx->module, ctx->has_module,
                                 ctx->inferred, op});
      });
    }
  }

  void finish_forward(forward_state& state) {
    std::vector<torch::Tensor> flags;
    flags.reserve(state.checks.size());
    for (const auto& c : state.checks) flags.push_back(c.finite);
    const auto host = detail::to_host(flags);
    std::optional<non_finite_report> found;
    for (std::size_t k = 0; k < host.size(); ++k) {
      if (host[k] != 0.0) continue;
      const auto& c = state.checks[k];
      found = non_finite_report{c.has_module ? modules_[c.module] : std::string(), c.op, "forward output", state.step,
                                "", c.inferred};
      break;
    }
    if (found && !first_) first_ = found;
    if (state.hook_error) std::rethrow_exception(state.hook_error);
    if (found && settings_.anomaly) throw anomaly_error(found->text());
  }

  diagnostics_settings settings_;
  bool attached_ = false;
  std::vector<param_entry> params_;
  std::vector<std::string> modules_;
  std::vector<layer_health> report_;
  std::int64_t report_step_ = 0;
  std::vector<torch::Tensor> before_;
  std::int64_t before_step_ = -1;
  std::optional<non_finite_report> first_;
  std::vector<activation_hook> activation_hooks_;
  std::vector<gradient_hook> gradient_hooks_;
};

}  // namespace kiln
