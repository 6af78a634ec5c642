// kiln/accumulation/steps.hpp: N micro-batches per optimizer step (N = 1 means none), the
// default of the accumulation axis and the template for writing your own.
//
// Required members (kiln::accumulation_policy in kiln/concepts.hpp):
//   micro_steps()      how many micro-batches make one optimizer step;
//   is_sync_step(m)    whether micro-step m (0-based within the window) is the one whose
//                      backward synchronises gradients and after which the optimizer steps;
//   normalize(loss)    the loss each micro-step calls backward on, so that the accumulated
//                      gradient equals the gradient of the mean loss over the whole window.
#pragma once

#include <cstdint>
#include <string_view>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/recipe/fields.hpp"

namespace kiln::accumulation {

struct steps {
  using axis = kiln::axis::accumulation;
  static constexpr std::string_view kind = "steps";

  struct settings {
    std::int64_t steps = 1;
    template <class V>
    void describe(V& v) {
      v.field("steps", steps, "micro-batches per optimizer step (1 = no accumulation)", kiln::checks::positive);
    }
  };

  explicit steps(const settings& s) : steps_(s.steps), inverse_(1.0 / static_cast<double>(s.steps)) {}

  std::int64_t micro_steps() const { return steps_; }
  bool is_sync_step(std::int64_t micro) const { return micro == steps_ - 1; }

  // Mean over micro-batches of equal size: each micro-step contributes 1/N of its mean loss.
  torch::Tensor normalize(const torch::Tensor& loss) const { return steps_ == 1 ? loss : loss * inverse_; }

 private:
  std::int64_t steps_;
  double inverse_;
};

}  // namespace kiln::accumulation
