// kiln/sharding/single.hpp: one process holds everything, the default of the sharding axis
// and the template for writing your own.
//
// Required members (kiln::sharding_policy in kiln/concepts.hpp):
//   rank(), world_size()   this process's place in the job;
//   prepare(model)         place/broadcast/shard parameters (after checkpointing wrapped blocks);
//   no_sync()              an RAII scope: backward inside it must not synchronise gradients
//                          (accumulation's non-final micro-steps);
//   finish_backward()      after backward on a sync micro-step: wait for/launch gradient sync;
//   all_ranks_true(b)      logical AND over ranks (the precision axis's finite check);
//   sum_over_ranks(t)      element-wise sum over ranks (evaluation metrics).
// Optional:
//   static constexpr bool distributed = true   ranks come from the launch environment (the
//                                              CLI then gives the loader this rank's shard);
//   static constexpr bool averages_gradients = true
//                                              gradients are averaged over ranks (ddp): the
//                                              accumulation axis then averages its sample and
//                                              token counts over ranks too;
//   attach(weights, compensations)             called once prepare(), the precision policy and
//                                              the optimizer are set up, with the tensors the
//                                              optimizer will update (bf16-pure: fp32 masters;
//                                              the model's parameters may have changed dtype
//                                              since prepare()) and its Kahan compensation of
//                                              each (undefined where none): such a weight's
//                                              value is weight + compensation;
//   after_optimizer_step(step, total, weights) called after every optimizer step with the
//                                              tensors the optimizer updates (local-sgd
//                                              averages them there);
//   optimizer_shards(named weights, elementwise) the optimizer is attached to what this returns
//                                              (zero1: this rank's rows of each weight) instead
//                                              of the weights; `elementwise` says whether the
//                                              optimizer's update is (its elementwise_update);
//   before_optimizer_step()                    just before each optimizer step (zero1 points
//                                              its shards' gradients at the averaged ones);
//   gather_optimizer_state(state, prefix)      makes a checkpoint's optimizer entries whole (a
//                                              collective: every rank saves when it is present);
//   shard_optimizer_state(state, prefix)       the reverse, for loading: this rank's part;
//   buckets(), gradient_allreduces(), parameter_averages(), collective_bytes(),
//   allreduce_wait_s()                         reported in summary.json when present.
#pragma once

#include <cstdint>
#include <string_view>

#include <torch/torch.h>

#include "kiln/concepts.hpp"

namespace kiln::sharding {

struct single {
  using axis = kiln::axis::sharding;
  static constexpr std::string_view kind = "single";

  struct settings {
    template <class V>
    void describe(V&) {}
  };

  explicit single(const settings& = {}) {}

  std::int64_t rank() const { return 0; }
  std::int64_t world_size() const { return 1; }

  void prepare(torch::nn::Module& /*model*/) {}

  struct scope {};
  scope no_sync() { return {}; }

  void finish_backward() {}

  bool all_ranks_true(bool local) { return local; }
  torch::Tensor sum_over_ranks(const torch::Tensor& t) { return t; }
};

}  // namespace kiln::sharding
