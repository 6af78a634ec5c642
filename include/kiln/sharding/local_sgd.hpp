// kiln/sharding/local_sgd.hpp: local SGD (Lin et al. 2018, "Don't use large mini-batches, use
// local SGD"; Accelerate's LocalSGD).
//
// Every rank trains its own replica on its shard of the data with no gradient all-reduce at all;
// every `sync_every` optimizer steps, and after the run's last step, the replicas' parameters
// are averaged. With sync_every = 1 and a linear update rule (SGD, with or without momentum) this
// is DDP exactly; larger values trade some agreement between replicas for sync_every times fewer
// collectives. Optimizer state (momentum, Adam's moments) stays local to each rank, as in
// Accelerate's LocalSGD. Buffers (BatchNorm's running statistics) follow rank 0's at each
// average, as DDP's do at each step, so the ranks evaluate and save one model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/settings/fields.hpp"
#include "kiln/sharding/detail/replicated.hpp"

namespace kiln::sharding {

class local_sgd : public kiln::detail::replicated_base {
 public:
  using axis = kiln::axis::sharding;
  static constexpr std::string_view kind = "local-sgd";
  static constexpr bool distributed = true;

  struct settings {
    std::int64_t sync_every = 8;  // optimizer steps between parameter averages
    double bucket_mb = 25.0;
    c10d_backend backend = c10d_backend::automatic;  // NCCL on GPUs where built, else Gloo
    double timeout_s = 300.0;
    template <class V>
    void describe(V& v) {
      v.field("sync_every", sync_every, "optimizer steps between averages of the ranks' parameters",
              checks::positive);
      v.field("bucket_mb", bucket_mb, "parameter bucket size in MB: one all-reduce per bucket per average",
              checks::positive);
      v.field("backend", backend,
              "c10d backend: auto (NCCL where LibTorch has it and a GPU is visible, else Gloo), gloo or nccl");
      v.field("timeout_s", timeout_s,
              "seconds a collective waits for a silent rank before the job fails (a rank that exits fails it at once)",
              checks::positive);
    }
  };

  explicit local_sgd(const settings& s) : replicated_base(kind, s.timeout_s, s.backend), settings_(s) {}

  void prepare(torch::nn::Module& model) { replicate(model, megabytes(settings_.bucket_mb)); }

  // The accelerator's call once the precision policy has made the weights the optimizer updates
  // (bf16-pure: fp32 masters of the bf16 model, or under Kahan the bf16 parameters themselves,
  // with the optimizer's compensation of each, undefined where none): the averages go through
  // buckets over those, in their dtype, and the buffers' in theirs. A compensated weight's value
  // is finer than bf16, so its bucket is fp32.
  void attach(const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& compensations) {
    check_weights(weights);
    compensations_.clear();
    if (std::any_of(compensations.begin(), compensations.end(), [](const auto& c) { return c.defined(); }))
      compensations_ = compensations;
    buckets_ = compensations_.empty()
                   ? buckets_over(weights)
                   : kiln::detail::make_buckets(weights, cap_bytes_, -1, [](c10::ScalarType) { return c10::kFloat; });
    buffer_buckets_ = buckets_over(buffers_);
  }

  struct scope {};
  scope no_sync() { return {}; }
  void finish_backward() {}

  // Called by the accelerator after each optimizer step (`step` counts them from 1; `total` is the
  // run's length, 0 if unknown) with the weights the optimizer updates, in the order of the
  // model's trainable parameters: the model's own, or a precision policy's fp32 masters
  // (bf16-pure), which are what must be averaged; the accelerator then rounds them into the model.
  void after_optimizer_step(std::int64_t step, std::int64_t total, const std::vector<torch::Tensor>& weights) {
    check_weights(weights);
    if (step % settings_.sync_every == 0 || step == total) {
      // Under Kahan summation a weight's value is the bf16 weight plus its compensation: the fp32
      // buckets average that, and each rank splits the average back into the two, so the ranks
      // agree on both, as on fp32 masters (averaging the weights alone would leave each rank its
      // own compensation, and the ranks a bf16 ulp apart).
      kiln::detail::start_sync(*group_, buckets_, weights, /*average=*/true, compensations_);
      kiln::detail::start_sync(*group_, buffer_buckets_, buffers_, /*average=*/false);
      kiln::detail::finish_sync(*group_, buckets_, weights, /*average=*/true, compensations_);
      kiln::detail::finish_sync(*group_, buffer_buckets_, buffers_, /*average=*/false);
      ++averages_;
      for (const auto& b : buckets_) count_collective(b);
      for (const auto& b : buffer_buckets_) count_collective(b);
    }
  }

  std::int64_t parameter_averages() const { return averages_; }

 private:
  void check_weights(const std::vector<torch::Tensor>& weights) const {
    if (weights.size() != params_.size())
      throw config_error("local-sgd: the optimizer updates " + std::to_string(weights.size()) + " tensors, the model has " +
                         std::to_string(params_.size()) + " trainable parameters");
  }

  settings settings_;
  std::vector<torch::Tensor> compensations_;  // attach()'s, where the optimizer has any
  std::int64_t averages_ = 0;
};

}  // namespace kiln::sharding
