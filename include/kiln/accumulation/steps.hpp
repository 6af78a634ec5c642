// kiln/accumulation/steps.hpp: N micro-batches per optimizer step (N = 1 means none), the
// default of the accumulation axis and the template for writing your own.
//
// Required members (kiln::accumulation_policy in kiln/concepts.hpp):
//   micro_steps()           how many micro-batches make one (full) optimizer step;
//   unit()                  what the loss of one micro-batch is a mean over, so the caller knows
//                           what to count: micro_batch (plain mean over micro-batches), sample,
//                           or token (targets other than the ignore index);
//   normalize(loss, items, mean_over_ranks)
//                           the loss to call backward on, for a micro-batch whose loss is the
//                           mean over `items` units;
//   end_window(mean_over_ranks)
//                           after the window's last backward: the factor the accumulated
//                           gradients still need (exactly 1.0 when nothing is left to correct).
//   mean_over_ranks (kiln::rank_mean) is empty when this rank's gradients are its own; under
//   DDP it averages a count over the ranks, whose gradients the sharding policy averages.
// Optional: drop_partial_window() (an epoch's last, short window is skipped instead of
// stepped), save_state/load_state.
//
// Why a correction factor: normalising by the window's total item count needs that total
// before the first backward, i.e. all of the window's batches in hand. Instead each micro-batch
// is weighted by items / (N x reference), the reference being the item count of the first
// micro-batch of the run, and the gradients are multiplied by N x reference / total at the end.
// When every micro-batch has the reference count (the usual fixed-shape case) that factor is
// exactly 1.0 and costs nothing; otherwise one multiply per gradient tensor makes the window's
// gradient exactly that of one batch of its union (transformers #34191). The loss magnitudes in
// backward stay those of the plain mean, so fp16 loss scaling behaves as without accumulation.
//
// Across ranks (samples or tokens under DDP) the same holds with the job's counts: ranks hold
// different numbers of tokens, and averaging each rank's own mean would weight a token on a
// rank with few of them more than one on a rank with many. So the reference is the ranks' mean
// count of the first micro-batch (common to all ranks, then saved), every window ends with
// the ranks' mean window count, and even N = 1 is corrected: the averaged gradient is then
// that of one batch of every rank's micro-batches. It costs one 8-byte all-reduce per
// optimizer step, and nothing under "mean" or in one process.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::accumulation {

// What becomes of an epoch's last window when fewer micro-batches are left than a window holds.
enum class partial_window { step, drop };
constexpr auto choices(partial_window) {
  return std::to_array<choice<partial_window>>({{"step", partial_window::step}, {"drop", partial_window::drop}});
}

struct steps {
  using axis = kiln::axis::accumulation;
  static constexpr std::string_view kind = "steps";

  struct settings {
    std::int64_t steps = 1;
    loss_unit normalize = loss_unit::micro_batch;
    partial_window epoch_end = partial_window::step;
    template <class V>
    void describe(V& v) {
      v.field("steps", steps, "micro-batches per optimizer step (1 = no accumulation)", kiln::checks::positive);
      v.field("normalize", normalize,
              "loss normalisation over a window: \"mean\" of micro-batch losses, or by the total number of "
              "\"samples\" or \"tokens\" in the window (exact for uneven micro-batches)");
      v.field("epoch_end", epoch_end,
              "an epoch's last, shorter window: \"step\" it (normalised over what it holds) or \"drop\" it");
    }
  };

  explicit steps(const settings& s)
      : steps_(s.steps),
        unit_(s.normalize),
        drop_partial_(s.epoch_end == partial_window::drop) {
    if (auto e = kiln::checks::positive(s.steps)) throw config_error("accumulation.steps: " + *e);
  }

  std::int64_t micro_steps() const { return steps_; }
  loss_unit unit() const { return unit_; }
  bool drop_partial_window() const { return drop_partial_; }

  torch::Tensor normalize(const torch::Tensor& loss, double items, const rank_mean& mean_over_ranks) {
    const double weight = unit_ == loss_unit::micro_batch ? 1.0 : items;
    if (weight <= 0) throw data_error("accumulation: a micro-batch with no " + unit_name() + " to average over");
    const bool across_ranks = counts_across_ranks(mean_over_ranks);
    if (reference_ == 0) reference_ = across_ranks ? mean_over_ranks(weight) : weight;
    window_ += weight;
    if (steps_ == 1 && !across_ranks) return loss;  // the mean over one micro-batch is already right
    return loss * (weight / (static_cast<double>(steps_) * reference_));
  }

  double end_window(const rank_mean& mean_over_ranks) {
    double factor = 1.0;
    if (counts_across_ranks(mean_over_ranks))
      factor = static_cast<double>(steps_) * reference_ / mean_over_ranks(window_);
    else if (steps_ != 1)
      factor = static_cast<double>(steps_) * reference_ / window_;
    window_ = 0;
    return factor;
  }

  // The reference weight is part of the run: a resumed run scales its micro-batches alike.
  void save_state(state_dict& state, const std::string& prefix) const {
    state[prefix + "reference"] = torch::tensor(reference_, torch::kFloat64);
  }
  void load_state(const state_dict& state, const std::string& prefix) {
    if (auto it = state.find(prefix + "reference"); it != state.end()) reference_ = it->second.item<double>();
  }

 private:
  std::string unit_name() const { return unit_ == loss_unit::token ? "tokens" : "samples"; }
  // Micro-batches weigh alike everywhere; only sample and token counts differ between ranks.
  bool counts_across_ranks(const rank_mean& mean) const { return mean && unit_ != loss_unit::micro_batch; }

  std::int64_t steps_;
  loss_unit unit_;
  bool drop_partial_;
  double reference_ = 0;  // weight of the run's first micro-batch (its mean over ranks under DDP)
  double window_ = 0;     // weights seen in the current window
};

}  // namespace kiln::accumulation
