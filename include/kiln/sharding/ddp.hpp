// kiln/sharding/ddp.hpp: distributed data parallel, PyTorch DDP's algorithm on c10d (Gloo here).
//
// Every rank holds the whole model and trains on its own shard of each batch; the gradients are
// averaged over ranks before each optimizer step, so all ranks take the same step and stay
// identical (and equal to one process training on the global batch).
// - prepare(): rank 0's parameters are broadcast to every rank.
// - The gradients are averaged in buckets of about bucket_mb (the first: first_bucket_mb), in
//   reverse parameter order: a hook on each parameter copies its gradient into its bucket as
//   backward produces it, and a full bucket's all-reduce starts at once, on Gloo's threads, while
//   backward goes on with the earlier layers. Buckets are launched in bucket order, so every
//   rank issues the same collectives in the same order even if its hooks fire in a different one.
// - no_sync() (accumulation's non-final micro-steps): hooks do nothing and gradients accumulate
//   locally; the final micro-step's bucket holds the window's sum, so each optimizer step costs
//   exactly one all-reduce per bucket whatever the accumulation.
// - finish_backward() launches what backward did not fill (parameters unused this step send
//   their current gradient, or zeros), waits for every bucket and writes the averages back into
//   the parameters' .grad.
// - Buffers (BatchNorm's running statistics): rank 0's are broadcast at prepare() and, with
//   broadcast_buffers (the default, as in torch DDP), again at the end of every window, during
//   the gradient all-reduce, so every rank starts each window, evaluates and saves with rank
//   0's. torch broadcasts them before the forward of each synchronising micro-step instead;
//   the two agree without accumulation. Without broadcast_buffers each rank's statistics follow
//   its own data.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/settings/fields.hpp"
#include "kiln/sharding/detail/replicated.hpp"

namespace kiln::sharding {

class ddp : public kiln::detail::replicated_base {
 public:
  using axis = kiln::axis::sharding;
  static constexpr std::string_view kind = "ddp";
  static constexpr bool distributed = true;  // its ranks come from the launch environment
  static constexpr bool averages_gradients = true;  // so sample/token counts are averaged too

  struct settings {
    double bucket_mb = 25.0;       // torch DDP's bucket_cap_mb
    double first_bucket_mb = 1.0;  // torch DDP's _DEFAULT_FIRST_BUCKET_BYTES
    bool broadcast_buffers = true;  // torch DDP's broadcast_buffers
    c10d_backend backend = c10d_backend::automatic;  // NCCL on GPUs where built, else Gloo
    double timeout_s = 300.0;      // a peer silent this long fails the job
    template <class V>
    void describe(V& v) {
      v.field("bucket_mb", bucket_mb, "gradient bucket size in MB: one all-reduce per bucket", checks::positive);
      v.field("first_bucket_mb", first_bucket_mb,
              "size in MB of the first bucket (the last layers): small, so its all-reduce starts early in backward",
              checks::positive);
      v.field("broadcast_buffers", broadcast_buffers,
              "give every rank rank 0's buffers (BatchNorm statistics) after every optimizer step");
      v.field("backend", backend,
              "c10d backend: auto (NCCL where LibTorch has it and a GPU is visible, else Gloo), gloo or nccl");
      v.field("timeout_s", timeout_s,
              "seconds a collective waits for a silent rank before the job fails (a rank that exits fails it at once)",
              checks::positive);
    }
  };

  explicit ddp(const settings& s) : ddp(s, kind) {}
  ddp(const ddp&) = delete;  // the gradient hooks hold `this`
  ddp& operator=(const ddp&) = delete;

  void prepare(torch::nn::Module& model) {
    replicate(model, megabytes(settings_.bucket_mb), megabytes(settings_.first_bucket_mb));
    index_buckets();
    for (std::size_t i = 0; i < params_.size(); ++i)
      params_[i].register_hook([this, i](const torch::Tensor& grad) { on_gradient(i, grad); });
    start_backward();
  }

  // The accelerator's call once the precision policy has made what it will of the parameters:
  // bf16-pure turns the model bf16 after prepare(), and the buckets are rebuilt for it, so its
  // gradients travel as bf16 (where the backend sums bf16) rather than widened to fp32. The
  // hooks stay: the parameters are the same tensors. DDP reduces the model's own gradients, not
  // the optimizer's weights (fp32 masters); Kahan compensations stay equal on every rank, as
  // every rank applies the same averaged gradient to the same weights.
  void attach(const std::vector<torch::Tensor>& /*weights*/, const std::vector<torch::Tensor>& /*compensations*/) {
    buckets_ = buckets_over(params_, first_cap_bytes_);
    buffer_buckets_ = buckets_over(buffers_);
    index_buckets();
    start_backward();
  }

  class scope {
   public:
    explicit scope(ddp* owner) : owner_(owner), was_(owner->syncing_) { owner_->syncing_ = false; }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() { owner_->syncing_ = was_; }

   private:
    ddp* owner_;
    bool was_;
  };
  scope no_sync() { return scope(this); }

  void finish_backward() {
    torch::NoGradGuard no_grad;
    for (auto& b : buckets_)
      for (std::size_t k = 0; k < b.members.size() && b.waiting > 0; ++k) {
        // Members whose hook did not fire (unused this step) send what they have.
        const auto& p = params_[b.members[k]];
        if (!arrived_[b.members[k]]) fill(b, k, p.grad().defined() ? p.grad() : torch::zeros_like(p));
      }
    launch_ready_buckets();
    // The window's forwards are done with the buffers: rank 0's go out behind the gradients.
    const bool broadcast_buffers = settings_.broadcast_buffers && !buffer_buckets_.empty();
    if (broadcast_buffers) {
      kiln::detail::start_sync(*group_, buffer_buckets_, buffers_, /*average=*/false);
      for (const auto& b : buffer_buckets_) count_collective(b);
    }
    const double world = static_cast<double>(world_size());
    for (auto& b : buckets_) {
      const auto waiting_since = std::chrono::steady_clock::now();
      b.in_flight->wait();
      allreduce_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting_since).count();
      b.in_flight.reset();
      b.flat.div_(world);
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        auto& p = params_[b.members[k]];
        if (p.grad().defined()) p.mutable_grad().copy_(b.slot(k, p));
        else p.mutable_grad() = b.slot(k, p).to(p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      }
    }
    if (broadcast_buffers) kiln::detail::finish_sync(*group_, buffer_buckets_, buffers_, /*average=*/false);
    start_backward();
  }

  // Gradient all-reduces launched so far: tests and the summary check that an optimizer step
  // costs one all-reduce per bucket (buckets()).
  std::int64_t gradient_allreduces() const { return gradient_allreduces_; }
  // Seconds finish_backward() waited for all-reduces after backward ended: the communication
  // backward did not hide (it includes waiting for a slower rank to finish its backward). Under
  // NCCL, wait() only orders the GPU stream, so this is CPU time and reads near zero.
  double allreduce_wait_s() const { return allreduce_wait_s_; }

 protected:
  // For a policy built on ddp's gradient averaging (zero1): `policy_kind` names it in errors.
  ddp(const settings& s, std::string_view policy_kind)
      : replicated_base(policy_kind, s.timeout_s, s.backend), settings_(s) {}

 private:
  // A parameter's gradient for this backward: its slot gets it plus what earlier micro-steps of
  // the window accumulated in .grad (AccumulateGrad adds it to .grad after this hook; the bucket
  // then holds the window's sum). Runs on the thread that called backward().
  void on_gradient(std::size_t i, const torch::Tensor& grad) {
    if (!syncing_) return;
    torch::NoGradGuard no_grad;
    const auto [b, k] = slot_of_[i];
    const auto& p = params_[i];
    fill(buckets_[b], k, p.grad().defined() ? grad + p.grad() : grad);
    arrived_[i] = true;
    launch_ready_buckets();
  }

  void fill(kiln::detail::param_bucket& b, std::size_t k, const torch::Tensor& value) {
    b.slot(k, params_[b.members[k]]).copy_(value);
    --b.waiting;
  }

  // Launches full buckets in bucket order, from the first not yet launched.
  void launch_ready_buckets() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].waiting == 0) {
      auto& b = buckets_[next_launch_++];
      b.in_flight.emplace(group_->allreduce_sum(b.flat));
      ++gradient_allreduces_;
      count_collective(b);
    }
  }

  void index_buckets() {
    slot_of_.assign(params_.size(), {0, 0});
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      for (std::size_t k = 0; k < buckets_[b].members.size(); ++k) slot_of_[buckets_[b].members[k]] = {b, k};
  }

  void start_backward() {
    for (auto& b : buckets_) b.waiting = static_cast<std::int64_t>(b.members.size());
    arrived_.assign(params_.size(), false);
    next_launch_ = 0;
  }

  settings settings_;
  std::vector<std::pair<std::size_t, std::size_t>> slot_of_;  // parameter -> (bucket, member)
  std::vector<bool> arrived_;
  std::size_t next_launch_ = 0;
  bool syncing_ = true;
  std::int64_t gradient_allreduces_ = 0;
  double allreduce_wait_s_ = 0;
};

}  // namespace kiln::sharding
