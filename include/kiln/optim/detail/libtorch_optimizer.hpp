// kiln/optim/detail/libtorch_optimizer.hpp: what optim::sgd and optim::adamw share while they
// delegate the update rule to LibTorch's own optimizers.
//
// The policy keeps the parameter names, so optimizer state is saved and loaded by name
// ("optim/<param>/<field>") instead of through LibTorch's archive, whose keys are memory
// addresses and change format between 1.13 and 2.x.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/detail/compat.hpp"
#include "kiln/io/state.hpp"

namespace kiln::optim::detail {

using named_tensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Derived provides `template <class State, class F> static void for_each_field(State&, F&&)`
// calling f("name", tensor) for each state tensor of a parameter.
template <class Derived, class Optimizer, class ParamState>
class libtorch_optimizer {
 public:
  void zero_grad() { optimizer_->zero_grad(); }
  void step() { optimizer_->step(); }

  void set_lr(double lr) {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  }

  const named_tensors& parameters() const { return params_; }

  // Bytes of optimizer state held for all parameters (what ZeRO would shard).
  std::int64_t state_bytes() const {
    std::int64_t bytes = 0;
    for (const auto& [name, param] : params_) {
      if (auto* st = find_state(param)) for_each_field(*st, [&](const char*, const torch::Tensor& t) {
          if (t.defined()) bytes += t.numel() * static_cast<std::int64_t>(t.element_size());
        });
    }
    return bytes;
  }

  void save_state(kiln::state_dict& state, const std::string& prefix) const {
    for (const auto& [name, param] : params_) {
      auto* st = find_state(param);
      if (!st) continue;  // no step taken yet for this parameter
      state[prefix + name + "/step"] = kiln::scalar_tensor(static_cast<std::int64_t>(step_of(*st)));
      for_each_field(*st, [&](const char* field, const torch::Tensor& t) {
        if (t.defined()) state[prefix + name + "/" + field] = t.detach().clone();
      });
    }
  }

  void load_state(const kiln::state_dict& state, const std::string& prefix) {
    auto& map = optimizer_->state();
    for (const auto& [name, param] : params_) {
      auto step_key = prefix + name + "/step";
      if (!state.count(step_key)) continue;
      auto st = std::make_unique<ParamState>();
      set_step(*st, state.at(step_key).template item<std::int64_t>());
      for_each_field(*st, [&](const char* field, torch::Tensor& t) {
        auto it = state.find(prefix + name + "/" + field);
        if (it == state.end()) return;
        if (it->second.sizes() != param.sizes())
          throw kiln::state_error("saved optimizer state \"" + it->first + "\" has shape " +
                                  c10::str(it->second.sizes()) + ", parameter has " + c10::str(param.sizes()));
        t = it->second.to(param.options()).clone();
      });
      map[kiln::detail::optimizer_state_key(map, param)] = std::move(st);
    }
  }

 protected:
  template <class Options>
  void build(const named_tensors& named, const Options& options) {
    params_ = named;
    std::vector<torch::Tensor> tensors;
    tensors.reserve(named.size());
    for (const auto& [name, t] : named) tensors.push_back(t);
    optimizer_ = std::make_unique<Optimizer>(tensors, options);
  }

  ParamState* find_state(const torch::Tensor& param) const {
    auto& map = optimizer_->state();
    auto it = map.find(kiln::detail::optimizer_state_key(map, param));
    return it == map.end() ? nullptr : static_cast<ParamState*>(it->second.get());
  }

  template <class State, class F>
  static void for_each_field(State& st, F&& f) {
    Derived::for_each_field(st, std::forward<F>(f));
  }

  // Some rules (Adam's bias correction) count steps per parameter; others (SGD) do not.
  static std::int64_t step_of(const ParamState& st) {
    if constexpr (requires { st.step(); }) return st.step();
    else return 0;
  }
  static void set_step(ParamState& st, std::int64_t step) {
    if constexpr (requires { st.step(); }) st.step(step);
  }

  std::unique_ptr<Optimizer> optimizer_;
  named_tensors params_;
};

}  // namespace kiln::optim::detail
