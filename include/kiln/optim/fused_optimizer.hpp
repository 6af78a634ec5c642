// kiln/optim/fused_optimizer.hpp: the base kiln's optimizers are written on (sgd, adamw, lion,
// adafactor, adam8bit), public so that yours can be too.
//
// It keeps the parameters, one slot each (name, tensor, step count, state tensors), applies
// the no_decay patterns as a per-parameter weight decay, and provides the optimizer axis's
// members: attach, step, zero_grad, set_lr / lr, state_bytes, save_state / load_state (state
// by parameter name, so a resume finds it; kiln/io/state.hpp). A derived optimizer writes
//   void init_state(kiln::optim::slot&) const               create slot.state: named fp32 tensors
//   void update(kiln::optim::slot&, const torch::Tensor& g) const
//                                                         one step for one parameter; slot.step
//                                                         is already incremented and lr() current
// and its update calls apply_rule(rule, slot, grad, state...) with a rule over values:
//   apply_rule([=](auto& p, const auto& g, auto& v) { v = v * a + g * g * (1 - a); p = p - lr * g / (vsqrt(v) + eps); },
//              s, grad, s.field(0));
// which runs as one fused, vectorised pass over the parameter on the CPU (the same rule runs as
// whole-tensor ops elsewhere, CUDA). A rule sees SIMD vectors or floats; +, -, *, / with scalars
// and kiln::optim::vsqrt / vmax / vsign work on both. kiln/optim/sgd.hpp is the shortest example.
//
// Each parameter is one contiguous fp32 or bf16 tensor. With use_kahan_summation(true)
// (precision::bf16_pure's kahan = true), each bf16 parameter also has a bf16 compensation
// buffer that its updates are summed through, saved and resumed with the state.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/detail/glob.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"
#include "kiln/optim/detail/fused_loop.hpp"

namespace kiln::optim {

// What a rule may call on its values (vectors or floats).
using detail::vmax;
using detail::vsign;
using detail::vsqrt;

using named_tensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct slot {
  std::string name;
  torch::Tensor param;
  double weight_decay = 0;  // this parameter's: 0 where a no_decay pattern matches its name
  std::int64_t step = 0;    // updates applied (parameters without a gradient are not stepped)
  std::vector<std::pair<std::string, torch::Tensor>> state;
  torch::Tensor compensation;  // bf16, as the parameter, under Kahan summation; else undefined
  torch::Tensor& field(std::size_t i) { return state[i].second; }
};

// The no_decay setting every kiln optimizer has, and its help text.
inline constexpr const char* no_decay_help =
    "parameter name patterns without weight decay, e.g. [\"**bias\", \"**ln*.weight\"] "
    "('*' within a name segment, '**' across)";

template <class Derived>
class fused_optimizer {
 public:
  void attach(const named_tensors& named) {
    slots_.clear();
    for (const auto& [name, param] : named) {
      if (param.scalar_type() != torch::kFloat32 && param.scalar_type() != torch::kBFloat16)
        throw config_error("optimizer: parameter \"" + name + "\" is " + std::string(c10::toString(param.scalar_type())) +
                           "; kiln's optimizers update fp32 or bf16 parameters");
      if (!param.is_contiguous())
        throw config_error("optimizer: parameter \"" + name + "\" is not contiguous");
      if constexpr (requires { Derived::cpu_only; })
        if (!param.device().is_cpu())
          throw config_error("optimizer: parameter \"" + name + "\" is on " + param.device().str() + "; " +
                             std::string(Derived::kind) + " runs on CPU tensors only (so far)");
      slot s;
      s.name = name;
      s.param = param;
      s.weight_decay = decays(name) ? weight_decay_ : 0.0;
      if (kahan_ && param.scalar_type() == torch::kBFloat16) s.compensation = torch::zeros_like(param);
      slots_.push_back(std::move(s));
    }
  }

  void step() {
    if constexpr (!(requires(const Derived& d, slot& s) { d.init_state(s); })) {
      static_assert(kiln::detail::missing<Derived>,
                    "kiln: optimizer axis: a kiln::optim::fused_optimizer is missing `void init_state(kiln::optim::slot&) const`");
    } else if constexpr (!(requires(const Derived& d, slot& s, const torch::Tensor& g) { d.update(s, g); })) {
      static_assert(kiln::detail::missing<Derived>,
                    "kiln: optimizer axis: a kiln::optim::fused_optimizer is missing `void update(kiln::optim::slot&, const torch::Tensor& grad) const`");
    } else {
      step_all();
    }
  }

 private:
  void step_all() {
    torch::NoGradGuard no_grad;
    for (auto& s : slots_) {
      const auto& grad = s.param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) throw config_error("optimizer: parameter \"" + s.name + "\" has a sparse gradient");
      if (s.state.empty()) derived().init_state(s);
      ++s.step;
      derived().update(s, grad.is_contiguous() ? grad : grad.contiguous());
    }
  }

 public:
  // Gradients are zeroed in place, as LibTorch 1.13's optimizers do, not released (set_to_none):
  // the next backward then accumulates into buffers that already exist.
  void zero_grad() {
    for (auto& s : slots_)
      if (s.param.grad().defined()) s.param.mutable_grad().zero_();
  }

  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }

  // Runs the rules as tensor ops on CPU too: what CUDA runs, checkable here against the loop.
  void use_tensor_ops(bool on) { tensor_ops_ = on; }

  // Sums the updates of bf16 parameters attached after this call through a compensation buffer
  // each (Kahan summation), so that updates below half a bf16 ulp are not rounded away.
  void use_kahan_summation(bool on) { kahan_ = on; }

  const std::vector<slot>& slots() const { return slots_; }

  // Each parameter's Kahan compensation, in attach() order, undefined where it has none. Such a
  // weight's value is the parameter plus its compensation: what a sharding policy that averages
  // weights must average (local-sgd).
  std::vector<torch::Tensor> compensations() const {
    std::vector<torch::Tensor> out;
    for (const auto& s : slots_) out.push_back(s.compensation);
    return out;
  }

  std::int64_t state_bytes() const {
    std::int64_t bytes = 0;
    for (const auto& s : slots_) {
      for (const auto& [field, t] : s.state) bytes += t.numel() * static_cast<std::int64_t>(t.element_size());
      if (s.compensation.defined()) bytes += s.compensation.numel() * 2;
    }
    return bytes;
  }

  // "<prefix><param>/step" and "<prefix><param>/<field>" for each parameter that has stepped,
  // and "<prefix><param>/compensation" for each that has one.
  void save_state(kiln::state_dict& state, const std::string& prefix) const {
    for (const auto& s : slots_) {
      if (s.compensation.defined()) state[prefix + s.name + "/compensation"] = s.compensation.clone();
      if (s.state.empty()) continue;
      state[prefix + s.name + "/step"] = kiln::scalar_tensor(s.step);
      for (const auto& [field, t] : s.state) state[prefix + s.name + "/" + field] = t.clone();
    }
  }

  void load_state(const kiln::state_dict& state, const std::string& prefix) {
    for (auto& s : slots_) {
      if (s.compensation.defined()) {
        const auto key = prefix + s.name + "/compensation";
        if (!state.count(key))
          throw kiln::state_error("saved state has no entry \"" + key + "\": it was saved without Kahan summation "
                                  "(bf16-pure with kahan = false), and this run sums its bf16 updates with it");
        load_field(state, key, s.compensation);
      }
      auto step = state.find(prefix + s.name + "/step");
      if (step == state.end()) continue;
      derived().init_state(s);
      s.step = step->second.item<std::int64_t>();
      for (auto& [field, t] : s.state) load_field(state, prefix + s.name + "/" + field, t);
    }
  }

 protected:
  fused_optimizer(double lr, double weight_decay, std::vector<std::string> no_decay)
      : lr_(lr), weight_decay_(weight_decay), no_decay_(std::move(no_decay)) {}

  // Runs `rule` over a parameter of either storage type (see fused_loop.hpp).
  template <class Run>
  static void dispatch(const torch::Tensor& param, Run&& run) {
    if (param.scalar_type() == torch::kBFloat16) run(c10::BFloat16{});
    else run(float{});
  }

  // rule(p, g, state...) over one parameter (and its compensation) and its fp32 state tensors:
  // one fused pass on CPU; elsewhere (CUDA) the same rule as whole-tensor ops.
  template <class Rule, class... State>
  void apply_rule(const Rule& rule, const slot& s, const torch::Tensor& grad, State&... state) const {
    if (!s.param.is_cpu() || tensor_ops_) return detail::tensor_rule(rule, s.param, s.compensation, grad, state...);
    dispatch(s.param, [&](auto type) {
      using T = decltype(type);
      detail::fused_loop(s.param.numel(), rule, s.param.data_ptr<T>(), compensation_ptr(s), grad.data_ptr<T>(),
                 state.template data_ptr<float>()...);
    });
  }

  static c10::BFloat16* compensation_ptr(const slot& s) {
    return s.compensation.defined() ? s.compensation.data_ptr<c10::BFloat16>() : nullptr;
  }

 private:
  static void load_field(const kiln::state_dict& state, const std::string& key, torch::Tensor& t) {
    const auto& saved = kiln::require(state, key);
    if (saved.sizes() != t.sizes() || saved.scalar_type() != t.scalar_type())
      throw kiln::state_error("saved optimizer state \"" + key + "\" is " + std::string(c10::toString(saved.scalar_type())) +
                              c10::str(saved.sizes()) + ", expected " + std::string(c10::toString(t.scalar_type())) +
                              c10::str(t.sizes()));
    t.copy_(saved);
  }

  bool decays(const std::string& name) const {
    for (const auto& pattern : no_decay_)
      if (kiln::detail::glob_match(pattern.c_str(), name.c_str())) return false;
    return true;
  }
  Derived& derived() { return static_cast<Derived&>(*this); }

  double lr_;
  double weight_decay_;
  bool tensor_ops_ = false;
  bool kahan_ = false;
  std::vector<std::string> no_decay_;
  std::vector<slot> slots_;
};

}  // namespace kiln::optim
