// kiln/checkpointing/checkpoint.hpp: recompute a module's forward in backward instead of
// keeping its activations.
//
// kiln::checkpoint(fn, x, params) runs fn(x) without recording a graph, keeps only x, and in
// backward reruns fn(x) with grad on and backpropagates through the rerun.
// So that the rerun computes what the original did:
//   - the RNG state of x's device (CPU or that GPU) at the original forward is restored around
//     the rerun (dropout draws the same masks), and the caller's RNG stream continues as if
//     nothing had been rerun;
//   - the rerun happens under the CPU and CUDA autocast state of the original forward.
// The backward through the rerun runs inside the outer one (reentrant, as
// torch.utils.checkpoint(use_reentrant=True) does), so every tensor fn reads gets its gradient
// from its own AccumulateGrad node, once: gradient hooks fire exactly once per backward, as
// sharding needs. (Taking the parameters' gradients with autograd::grad() and returning them to
// the outer engine would fire their hooks twice on LibTorch 2.x, where grad() runs the hooks of
// the leaves it differentiates.) An empty anchor tensor that requires grad makes the output
// require grad even when x does not (the first block's input, say).
//
// A module opts in by deriving from kiln::checkpointable and calling run_checkpointed() in its
// forward; the checkpointing policies switch it on by name (kiln/checkpointing/blocks.hpp).
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "kiln/detail/torch.hpp"  // first: see there
#include "kiln/detail/compat.hpp"

namespace kiln {

namespace detail {

// The autocast regions active in forward, CPU and CUDA, for the rerun in backward (which the
// engine runs outside them).
struct autocast_state {
  bool cpu_enabled = false, cuda_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  static autocast_state current() {
    return {autocast_enabled(c10::DeviceType::CPU), autocast_enabled(c10::DeviceType::CUDA),
            autocast_dtype(c10::DeviceType::CPU), autocast_dtype(c10::DeviceType::CUDA)};
  }
  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["autocast_cpu"] = cpu_enabled;
    ctx->saved_data["autocast_cpu_dtype"] = static_cast<std::int64_t>(cpu_dtype);
    ctx->saved_data["autocast_cuda"] = cuda_enabled;
    ctx->saved_data["autocast_cuda_dtype"] = static_cast<std::int64_t>(cuda_dtype);
  }
  // Re-enters the saved regions for as long as `scopes` lives.
  static void restore(torch::autograd::AutogradContext* ctx, std::optional<autocast_scope> (&scopes)[2]) {
    if (ctx->saved_data["autocast_cpu"].toBool())
      scopes[0].emplace(c10::DeviceType::CPU, static_cast<at::ScalarType>(ctx->saved_data["autocast_cpu_dtype"].toInt()));
    if (ctx->saved_data["autocast_cuda"].toBool())
      scopes[1].emplace(c10::DeviceType::CUDA,
                        static_cast<at::ScalarType>(ctx->saved_data["autocast_cuda_dtype"].toInt()));
  }
};

class checkpoint_function : public torch::autograd::Function<checkpoint_function> {
 public:
  using forward_fn = std::function<torch::Tensor(const torch::Tensor&)>;

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& /*anchor*/, const forward_fn* fn) {
    ctx->saved_data["fn"] = reinterpret_cast<std::int64_t>(fn);
    // The generator dropout draws from is the one of the device the block runs on.
    ctx->saved_data["rng"] = at::Generator(at::globalContext().defaultGenerator(x.device())).get_state();
    autocast_state::current().save(ctx);
    ctx->saved_data["x_requires_grad"] = x.requires_grad();
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return (*fn)(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto* fn = reinterpret_cast<const forward_fn*>(ctx->saved_data["fn"].toInt());
    const bool x_requires_grad = ctx->saved_data["x_requires_grad"].toBool();
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(x_requires_grad);

    // Rerun with the original RNG state, then put the caller's state back.
    at::Generator generator = at::globalContext().defaultGenerator(x.device());
    const auto caller_rng = generator.get_state();
    generator.set_state(ctx->saved_data["rng"].toTensor());
    torch::Tensor out;
    {
      torch::AutoGradMode grad(true);
      std::optional<autocast_scope> cast[2];
      autocast_state::restore(ctx, cast);
      out = (*fn)(x);
    }
    generator.set_state(caller_rng);

    // The parameters' AccumulateGrad nodes (hooks included) run in here; x, a detached leaf,
    // collects its gradient in x.grad() for the outer graph.
    if (out.requires_grad()) torch::autograd::backward({out}, {grad_outputs[0]});
    return {x_requires_grad ? x.grad() : torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

// fn(x) whose activations are recomputed in backward. `params` are the parameters fn reads:
// the output requires grad when x or one of them does, as fn(x) itself would. `fn` must outlive
// the backward pass (a module's member, say).
inline torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& x,
                                const std::vector<torch::Tensor>& params) {
  if (!torch::GradMode::is_enabled()) return fn(x);  // evaluation: nothing to save anyway
  const bool trainable = std::any_of(params.begin(), params.end(), [](const auto& p) { return p.requires_grad(); });
  if (!trainable && !x.requires_grad()) return fn(x);  // no gradient flows here: nothing to recompute
  const auto anchor = torch::empty({0}, x.options().dtype(torch::kFloat).requires_grad(true));
  return detail::checkpoint_function::apply(x, anchor, &fn);
}

// A module whose forward can be recomputed in backward. Derive from it, put the forward's
// body in a member `forward_fn` and call run_checkpointed(x) from forward(); a checkpointing
// policy switches it on with set_checkpointed(true).
class checkpointable {
 public:
  virtual ~checkpointable() = default;
  void set_checkpointed(bool on) { checkpointed_ = on; }
  bool checkpointed() const { return checkpointed_; }

 protected:
  torch::Tensor run_checkpointed(torch::nn::Module& self, const torch::Tensor& x) {
    if (!checkpointed_) return body_(x);
    return checkpoint(body_, x, self.parameters());
  }
  void set_body(std::function<torch::Tensor(const torch::Tensor&)> body) { body_ = std::move(body); }

 private:
  bool checkpointed_ = false;
  std::function<torch::Tensor(const torch::Tensor&)> body_;
};

}  // namespace kiln
