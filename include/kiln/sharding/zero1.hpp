// kiln/sharding/zero1.hpp: ZeRO stage 1 (Rajbhandari et al. 2020; DeepSpeed's stage 1, torch's
// ZeroRedundancyOptimizer): ddp's gradient averaging, with the optimizer's state sharded across
// ranks, so that each rank holds 1/N of it.
//
// - Gradients are averaged exactly as ddp averages them (the same buckets, hooks, overlap with
//   backward and no_sync()): after backward every rank holds the whole averaged gradient.
// - The optimizer is attached to this rank's shard of each weight it updates, under the weight's
//   name: rows [r c, min((r + 1) c, rows)) of dim 0, c = ceil(rows / N) (torch.chunk's split,
//   and FSDP2's; a small tensor may give a rank no rows, and a 0-dim weight counts as one row).
//   A shard is a view of its weight, and its gradient a view of the weight's gradient, so the
//   optimizer updates this rank's rows in place and keeps state (AdamW's moments, SGD's
//   momentum) for them only. Clipping and the finite check see whole, identical gradients.
// - After the step, each rank's updated rows are all-gathered, in buckets of about bucket_mb
//   (padded to equal shards, as FSDP2 pads), so every rank starts the next forward with the
//   whole updated model. With bf16-pure's fp32 masters these are the masters, and the precision
//   policy rounds them into the model afterwards, as without sharding.
// - Checkpoints hold the whole optimizer state, as ddp's do: saving all-gathers each state
//   tensor (every rank takes part; rank 0 writes) and loading takes this rank's rows of it. A
//   run saved under zero1 at N ranks resumes under zero1 at any number of ranks, or under ddp or
//   single, and the other way round.
// - Only an optimizer whose update is elementwise can be split by rows
//   (`static constexpr bool elementwise_update = true`: sgd, adamw and lion). Adafactor's
//   factored moments average whole rows and columns and adam8bit's quantisation blocks span
//   rows, so zero1 refuses them.
//
// Per step it communicates ddp's all-reduce plus one all-gather of the weights (1.5x ddp's
// bytes); zero2 replaces the all-reduce by a reduce-scatter.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"
#include "kiln/sharding/ddp.hpp"

namespace kiln::sharding {

class zero1 : public ddp {
 public:
  static constexpr std::string_view kind = "zero1";
  using settings = ddp::settings;

  explicit zero1(const settings& s) : ddp(s, kind), gather_cap_bytes_(megabytes(s.bucket_mb)) {}

  // The accelerator's call before it attaches the optimizer, with the weights the optimizer
  // would update (and whether it updates them elementwise): this rank's shard of each.
  std::vector<std::pair<std::string, torch::Tensor>> optimizer_shards(
      const std::vector<std::pair<std::string, torch::Tensor>>& weights, bool elementwise_update) {
    if (!elementwise_update)
      throw config_error("[sharding] kind = \"zero1\" splits the optimizer's state by rows, which needs an optimizer "
                         "whose update is elementwise (sgd, adamw, lion); adafactor's factored moments and adam8bit's "
                         "quantisation blocks span rows: use ddp with them");
    weights_.clear();
    shards_.clear();
    index_.clear();
    std::vector<std::pair<std::string, torch::Tensor>> shards;
    for (const auto& [name, weight] : weights) {
      index_[name] = weights_.size();
      weights_.push_back(weight);
      auto shard = own_rows(as_rows(weight.detach()), weight);
      shards_.push_back(shard);
      shards.emplace_back(name, shard);
    }
    gather_buckets_ = make_gather_buckets();
    return shards;
  }

  // Before the optimizer steps: each shard's gradient is its rows of the weight's (averaged) one.
  void before_optimizer_step() {
    for (std::size_t i = 0; i < weights_.size(); ++i)
      if (weights_[i].grad().defined()) shards_[i].mutable_grad() = own_rows(as_rows(weights_[i].grad()), weights_[i]);
  }

  // After it: every rank's updated rows to every rank, and the weights' gradients zeroed (the
  // optimizer zeroed its shards' rows only).
  void after_optimizer_step(std::int64_t /*step*/, std::int64_t /*total_steps*/, std::vector<torch::Tensor>& /*weights*/) {
    torch::NoGradGuard no_grad;
    for (auto& b : gather_buckets_) {
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        const auto& shard = shards_[b.members[k]];
        b.input.narrow(0, b.offsets[k], shard.numel()).copy_(shard.reshape({-1}));
      }
      b.in_flight.emplace(group_->allgather(b.flat.chunk(world_size()), b.input));
      count_gather(b);
    }
    for (auto& w : weights_)  // while the all-gathers run
      if (w.grad().defined()) w.mutable_grad().zero_();
    for (auto& b : gather_buckets_) {
      b.in_flight->wait();
      b.in_flight.reset();
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        const auto& weight = weights_[b.members[k]];
        auto rows = as_rows(weight);
        const auto row_numel = rows.numel() / std::max<std::int64_t>(rows.size(0), 1);
        for (std::int64_t r = 0; r < world_size(); ++r) {
          const auto [begin, count] = rows_of(rows.size(0), r);
          if (count == 0 || r == rank()) continue;  // its own rows are the optimizer's, already in place
          rows.narrow(0, begin, count)
              .copy_(b.flat.narrow(0, r * b.chunk + b.offsets[k], count * row_numel).view(rows.narrow(0, begin, count).sizes()));
        }
      }
    }
  }

  // A checkpoint's optimizer state: this rank's entries (shaped as its shards) replaced by the
  // whole tensors, all-gathered. Every rank must call it, at the same step.
  void gather_optimizer_state(state_dict& state, const std::string& prefix) {
    torch::NoGradGuard no_grad;
    for (auto& [key, value] : state) {
      const auto i = weight_of(key, prefix);
      if (i == npos) continue;
      const auto& weight = weights_[i];
      if (value.sizes() != shards_[i].sizes())
        throw state_error("zero1: optimizer state \"" + key + "\" is not shaped as its parameter's shard");
      const auto rows = as_rows(weight).size(0);
      const auto chunk_rows = rows_of(rows, 0).second;
      auto wire = group_->wire_dtype(value.scalar_type());
      auto shape = as_rows(weight).sizes().vec();
      shape[0] = chunk_rows;
      auto input = torch::zeros(shape, value.options().dtype(wire));
      if (value.numel() > 0) input.narrow(0, 0, value.size(0)).copy_(as_rows(value));
      shape[0] = chunk_rows * world_size();
      auto gathered = torch::empty(shape, input.options());
      group_->allgather(gathered.chunk(world_size()), input).wait();
      value = gathered.narrow(0, 0, rows).to(value.scalar_type()).reshape(weight.sizes()).contiguous();
    }
  }

  // The optimizer state of a checkpoint (whole tensors, as any sharding policy saves them) cut
  // to this rank's rows, for the optimizer's load_state.
  state_dict shard_optimizer_state(const state_dict& state, const std::string& prefix) const {
    state_dict out = state;
    for (auto& [key, value] : out) {
      const auto i = weight_of(key, prefix);
      if (i == npos || value.sizes() != weights_[i].sizes()) continue;  // load_state names a wrong shape
      value = own_rows(as_rows(value), weights_[i]).clone();
    }
    return out;
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  // The weights' all-gather, in buckets: each rank's chunk holds its padded shard of every member.
  struct gather_bucket {
    std::vector<std::size_t> members;   // indices into weights_
    std::vector<std::int64_t> offsets;  // of each member's shard within a rank's chunk
    std::int64_t chunk = 0;             // elements per rank
    torch::Tensor flat;                 // world_size() chunks, in the group's wire dtype
    torch::Tensor input;                // this rank's chunk (its padding stays zero)
    std::optional<kiln::detail::pending_collective> in_flight;
  };

  // A weight seen as rows: itself, or a 0-dim weight as one row of one element.
  static torch::Tensor as_rows(const torch::Tensor& t) { return t.dim() == 0 ? t.view({1}) : t; }

  // Rank r's rows of a tensor of `rows` rows: (first row, count).
  std::pair<std::int64_t, std::int64_t> rows_of(std::int64_t rows, std::int64_t r) const {
    const auto chunk = (rows + world_size() - 1) / world_size();
    const auto begin = std::min(rows, r * chunk);
    return {begin, std::min(rows, begin + chunk) - begin};
  }

  // This rank's rows of `rows` (as_rows of a tensor shaped like `weight`).
  torch::Tensor own_rows(const torch::Tensor& rows, const torch::Tensor& weight) const {
    const auto [begin, count] = rows_of(as_rows(weight).size(0), rank());
    return rows.narrow(0, begin, count);
  }

  // The weight a state entry "<prefix><weight name>/<field>" belongs to; npos for others and
  // for the step count.
  std::size_t weight_of(const std::string& key, const std::string& prefix) const {
    if (key.rfind(prefix, 0) != 0) return npos;
    const auto slash = key.rfind('/');
    if (slash == std::string::npos || slash < prefix.size() || key.compare(slash, std::string::npos, "/step") == 0)
      return npos;
    const auto found = index_.find(key.substr(prefix.size(), slash - prefix.size()));
    return found == index_.end() ? npos : found->second;
  }

  // Consecutive weights of one dtype, up to bucket_mb of padded shards per rank each.
  std::vector<gather_bucket> make_gather_buckets() const {
    std::vector<gather_bucket> buckets;
    std::int64_t bytes = 0;
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      const auto rows = as_rows(weights_[i]);
      const auto padded = rows_of(rows.size(0), 0).second * (rows.numel() / std::max<std::int64_t>(rows.size(0), 1));
      const auto wire = group_->wire_dtype(weights_[i].scalar_type());
      const auto size = padded * static_cast<std::int64_t>(c10::elementSize(wire));
      if (buckets.empty() || (bytes > 0 && bytes + size > gather_cap_bytes_) ||
          weights_[buckets.back().members.front()].scalar_type() != weights_[i].scalar_type()) {
        buckets.emplace_back();
        bytes = 0;
      }
      auto& b = buckets.back();
      b.members.push_back(i);
      b.offsets.push_back(b.chunk);
      b.chunk += padded;
      bytes += size;
    }
    for (auto& b : buckets) {
      const auto& first = weights_[b.members.front()];
      b.flat = torch::empty({b.chunk * world_size()}, first.options().dtype(group_->wire_dtype(first.scalar_type())));
      b.input = torch::zeros({b.chunk}, b.flat.options());
    }
    return buckets;
  }

  void count_gather(const gather_bucket& b) { collective_bytes_ += b.chunk * b.flat.element_size(); }

  std::int64_t gather_cap_bytes_;
  std::vector<torch::Tensor> weights_;  // what the optimizer would update without sharding
  std::vector<torch::Tensor> shards_;   // this rank's rows of each (views)
  std::map<std::string, std::size_t> index_;  // weight name -> index
  std::vector<gather_bucket> gather_buckets_;
};

}  // namespace kiln::sharding
