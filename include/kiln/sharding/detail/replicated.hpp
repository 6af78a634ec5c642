// kiln/sharding/detail/replicated.hpp: what the replicated-parameter policies (ddp, local-sgd)
// share: joining the job's process group, flat buckets over the parameters, and the small
// collectives the accelerator asks every sharding policy for.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/detail/process_group.hpp"
#include "kiln/errors.hpp"

namespace kiln::detail {

// The process group of a job started by `kiln launch` or torchrun; a clear error otherwise.
// `backend`: the policy's setting.
inline std::unique_ptr<process_group> join_process_group(std::string_view kind, double timeout_s,
                                                         c10d_backend setting) {
  auto env = read_dist_env();
  const auto backend = resolve_backend(setting, "[sharding] backend", env ? env->local_world : 1);
  if (!env)
    throw config_error("[sharding] kind = \"" + std::string(kind) +
                       "\" needs its ranks started together: run `kiln launch -n N RECIPE`, or torchrun, which set "
                       "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (unset here)");
  return std::make_unique<process_group>(
      *env, std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000.0)), backend);
}

// A run of parameters of one dtype laid end to end in one contiguous tensor (of the dtype the
// group carries theirs in): one collective per bucket instead of one per parameter (Gloo's
// per-message latency dominates small tensors).
struct param_bucket {
  torch::Tensor flat;
  std::vector<std::size_t> members;   // indices into the parameter list
  std::vector<std::int64_t> offsets;  // of each member in flat
  std::int64_t waiting = 0;           // members whose gradient has not arrived in this backward
  std::optional<pending_collective> in_flight;

  torch::Tensor slot(std::size_t k, const torch::Tensor& like) const {
    return flat.narrow(0, offsets[k], like.numel()).view(like.sizes());
  }
};

// What a bucket of one dtype's values travels in: the same dtype, unless the backend cannot sum
// it (process_group::wire_dtype).
using wire_dtype_of = std::function<c10::ScalarType(c10::ScalarType)>;

// Buckets of at most cap_bytes (one parameter larger than that gets a bucket of its own), in
// reverse parameter order: backward produces the last layers' gradients first, so the first
// bucket fills first and its all-reduce starts while earlier layers are still differentiating.
// first_cap_bytes (torch DDP: 1 MiB) caps the first bucket of each dtype: small, it fills after
// the last few layers' gradients, so communication starts early instead of after most of backward.
// A bucket holds one dtype's parameters and its flat tensor is in their wire dtype; the caps
// count the bytes on the wire.
inline std::vector<param_bucket> make_buckets(const std::vector<torch::Tensor>& params, std::int64_t cap_bytes,
                                              std::int64_t first_cap_bytes = -1, const wire_dtype_of& wire = {}) {
  if (first_cap_bytes < 0) first_cap_bytes = cap_bytes;
  const auto carried = [&](c10::ScalarType t) { return wire ? wire(t) : t; };
  std::vector<param_bucket> buckets;
  std::int64_t bytes = 0, elements = 0;
  std::set<c10::ScalarType> dtypes_seen;
  bool first_of_dtype = false;  // the open bucket is its dtype's first
  auto close = [&] {
    if (buckets.empty() || buckets.back().members.empty()) return;
    const auto& first = params[buckets.back().members.front()];
    buckets.back().flat = torch::zeros({elements}, first.options().dtype(carried(first.scalar_type())));
    bytes = elements = 0;
  };
  for (std::size_t i = params.size(); i-- > 0;) {
    const auto& p = params[i];
    if (p.is_sparse()) throw config_error("ddp/local-sgd: sparse parameters are not supported");
    const auto size = static_cast<std::int64_t>(p.numel() * c10::elementSize(carried(p.scalar_type())));
    const auto cap = first_of_dtype ? first_cap_bytes : cap_bytes;
    const bool new_bucket = buckets.empty() || (bytes > 0 && bytes + size > cap) ||
                            params[buckets.back().members.front()].scalar_type() != p.scalar_type();
    if (new_bucket) {
      close();
      buckets.emplace_back();
      first_of_dtype = dtypes_seen.insert(p.scalar_type()).second;
    }
    buckets.back().members.push_back(i);
    buckets.back().offsets.push_back(elements);
    bytes += size;
    elements += p.numel();
  }
  close();
  return buckets;
}

// The trainable parameters of `model`, in registration order (the same on every rank).
inline std::vector<torch::Tensor> trainable_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> params;
  for (auto& p : model.parameters(/*recurse=*/true))
    if (p.requires_grad()) params.push_back(p);
  return params;
}

// The buffers a replica's forward depends on and updates (BatchNorm's running statistics and
// batch count), in registration order: floating-point ones and integer counters.
inline std::vector<torch::Tensor> synchronised_buffers(torch::nn::Module& model) {
  std::vector<torch::Tensor> buffers;
  for (auto& b : model.buffers(/*recurse=*/true))
    if (b.is_floating_point() || b.scalar_type() == torch::kLong) buffers.push_back(b);
  return buffers;
}

// Starts one collective per bucket on the values of its members: the bucket-sized messages
// travel back to back. `average`: a sum (Gloo has no average; finish_sync divides); else rank
// 0's values go to everyone. `compensations` (empty, or one per tensor, undefined where none):
// Kahan residuals, each tensor's value being tensor + compensation; the buckets must then be
// fine enough to hold that sum (fp32).
inline void start_sync(process_group& group, std::vector<param_bucket>& buckets,
                       const std::vector<torch::Tensor>& tensors, bool average,
                       const std::vector<torch::Tensor>& compensations = {}) {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets) {
    for (std::size_t k = 0; k < b.members.size(); ++k) {
      const auto i = b.members[k];
      auto value = b.slot(k, tensors[i]);
      value.copy_(tensors[i]);
      if (!compensations.empty() && compensations[i].defined()) value.add_(compensations[i]);
    }
    b.in_flight.emplace(average ? group.allreduce_sum(b.flat) : group.broadcast(b.flat, 0));
  }
}

// Waits for start_sync's collectives and writes the results back into the tensors; a compensated
// tensor gets the result rounded to its dtype and its compensation what that rounding left over.
inline void finish_sync(process_group& group, std::vector<param_bucket>& buckets,
                        const std::vector<torch::Tensor>& tensors, bool average,
                        const std::vector<torch::Tensor>& compensations = {}) {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets) {
    b.in_flight->wait();
    b.in_flight.reset();
    if (average) b.flat.div_(static_cast<double>(group.world()));
    for (std::size_t k = 0; k < b.members.size(); ++k) {
      const auto i = b.members[k];
      const auto value = b.slot(k, tensors[i]);
      tensors[i].copy_(value);
      if (!compensations.empty() && compensations[i].defined()) compensations[i].copy_(value - tensors[i]);
    }
  }
}

// Both, back to back: for a sync nothing else needs to overlap.
inline void sync_tensors(process_group& group, std::vector<param_bucket>& buckets,
                         const std::vector<torch::Tensor>& tensors, bool average) {
  start_sync(group, buckets, tensors, average);
  finish_sync(group, buckets, tensors, average);
}

// The members every sharding policy has, for a policy holding a process group.
class replicated_base {
 public:
  replicated_base(std::string_view kind, double timeout_s, c10d_backend backend)
      : group_(join_process_group(kind, timeout_s, backend)) {}

  std::int64_t rank() const { return group_->rank(); }
  std::int64_t world_size() const { return group_->world(); }

  // All ranks must agree to step (the precision axis's finite check): one 1-element all-reduce.
  bool all_ranks_true(bool local) {
    auto votes_against = torch::full({1}, local ? 0.0f : 1.0f, torch::TensorOptions().device(group_->staging_device()));
    group_->allreduce_sum(votes_against).wait();
    return votes_against.item<float>() == 0.0f;
  }

  // On t's device; through the group's (NCCL: the rank's GPU) where the backend needs it.
  torch::Tensor sum_over_ranks(const torch::Tensor& t) {
    const bool staged = group_->kind() == backend::nccl && !t.is_cuda();
    auto total = staged ? t.to(group_->staging_device()).contiguous() : t.contiguous().clone();
    group_->allreduce_sum(total).wait();
    return staged ? total.to(t.device()) : total;
  }

  process_group& group() { return *group_; }

  // Bytes this rank sent into training collectives (gradient all-reduces, parameter averages;
  // not the start-up broadcast): the summary's measure of a policy's communication volume.
  std::int64_t collective_bytes() const { return collective_bytes_; }
  // Parameter buckets: one collective each per gradient all-reduce or parameter average.
  std::int64_t buckets() const { return static_cast<std::int64_t>(buckets_.size()); }

 protected:
  void count_collective(const param_bucket& b) { collective_bytes_ += b.flat.numel() * b.flat.element_size(); }

  // What every replica starts from: rank 0's trainable parameters and buffers, sent to every rank
  // in buckets of cap_bytes (the first of each dtype: first_cap_bytes), which stay for later syncs.
  void replicate(torch::nn::Module& model, std::int64_t cap_bytes, std::int64_t first_cap_bytes = -1) {
    params_ = trainable_parameters(model);
    if (group_->kind() == backend::nccl)  // NCCL reduces GPU tensors only
      for (const auto& p : params_)
        if (!p.is_cuda())
          throw config_error("[sharding] backend is NCCL, which reduces GPU tensors, and the model is on " +
                             p.device().str() + "; set [train] device = \"cuda\" (or \"auto\"), or [sharding] "
                             "backend = \"gloo\" to train on the CPU");
    if (!params_.empty()) group_->use_device(params_.front().device());
    cap_bytes_ = cap_bytes;
    first_cap_bytes_ = first_cap_bytes;
    buckets_ = buckets_over(params_, first_cap_bytes_);
    sync_tensors(*group_, buckets_, params_, /*average=*/false);
    buffers_ = synchronised_buffers(model);
    buffer_buckets_ = buckets_over(buffers_);
    sync_tensors(*group_, buffer_buckets_, buffers_, /*average=*/false);
  }

  // Buckets over `tensors` with this policy's caps, in the dtypes this group carries them in.
  std::vector<param_bucket> buckets_over(const std::vector<torch::Tensor>& tensors, std::int64_t first_cap_bytes = -1) {
    return make_buckets(tensors, cap_bytes_, first_cap_bytes, [this](c10::ScalarType t) { return group_->wire_dtype(t); });
  }

  static std::int64_t megabytes(double mb) { return static_cast<std::int64_t>(mb * 1024 * 1024); }

  std::unique_ptr<process_group> group_;
  std::int64_t collective_bytes_ = 0;
  std::int64_t cap_bytes_ = 0, first_cap_bytes_ = -1;  // replicate()'s
  std::vector<torch::Tensor> params_;             // trainable, in registration order
  std::vector<param_bucket> buckets_;             // over params_
  std::vector<torch::Tensor> buffers_;            // synchronised_buffers()
  std::vector<param_bucket> buffer_buckets_;      // over buffers_
};

}  // namespace kiln::detail
