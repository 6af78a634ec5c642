// kiln/precision/fp32.hpp: full fp32 training, the default of the precision axis.
//
// This file is also the template for writing your own precision policy: copy it, rename the
// struct and `kind`, and fill in the members. Every member below is required by
// kiln::precision_policy (kiln/concepts.hpp); a missing one stops the build with a sentence
// naming it. The accelerator calls them in this order on every micro-step:
//
//   { auto scope = p.autocast(); loss = forward + loss; }      // mixed precision lives here
//   p.scale(loss).backward();                                   // loss scaling lives here
// and on every optimizer (sync) step:
//   bool finite = p.unscale_and_check(params);                  // grads back to true scale
//   finite = sharding.all_ranks_true(finite);                   // every rank agrees
//   p.update(finite);                                           // e.g. grow or back off a scale
//   if (finite) optimizer.step();
//
// Optional: `void save_state(kiln::state_dict&, const std::string& prefix) const` and
// `void load_state(const kiln::state_dict&, const std::string& prefix)` if the policy has
// state that must survive a resume (a loss scale, say); `static constexpr bool always_finite =
// true` if unscale_and_check() can never return false, which spares distributed runs the
// all_ranks_true() all-reduce on every step; `void use_device(const torch::Device&)` to learn the
// device (and refuse one it cannot run on); `prepare(model, named_parameters)` returning the
// named tensors the optimizer should update instead (bf16-pure's fp32 masters), with
// `void after_step()` to round them back into the model after each update; `bool
// kahan_summation() const` to ask the optimizer for Kahan-summed updates.
#pragma once

#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"

namespace kiln::precision {

struct fp32 {
  using axis = kiln::axis::precision;
  static constexpr std::string_view kind = "fp32";
  static constexpr bool always_finite = true;  // nothing scaled, no step to skip

  // Mirrors the recipe's [precision] table (besides `kind`); fp32 has nothing to set.
  struct settings {
    template <class V>
    void describe(V&) {}
  };

  explicit fp32(const settings& = {}) {}

  // Nothing to switch on: an empty scope the compiler removes.
  struct scope {};
  scope autocast() const { return {}; }

  torch::Tensor scale(const torch::Tensor& loss) const { return loss; }

  // fp32 never skips a step: a non-finite gradient is the model's problem, reported by the
  // diagnostics, not a loss-scale overflow to recover from.
  bool unscale_and_check(std::vector<torch::Tensor>& /*params*/) { return true; }

  void update(bool /*all_finite*/) {}
};

}  // namespace kiln::precision
