// kiln/precision/bf16_pure.hpp: bfloat16 parameters and activations, fp32 master weights.
//
// The model's parameters become bf16 (half the bytes of fp32 for weights, gradients and every
// activation), and the optimizer updates fp32 master copies instead: a bf16 weight has 8 bits
// of mantissa, so an update smaller than 1/256 of the weight would round away to nothing if it
// were applied in bf16. Each sync step copies the bf16 gradients into the masters' fp32
// gradients, the optimizer steps the masters, and the masters are rounded back into the model.
// (Kahan-compensated bf16 updates would save the 4 bytes per parameter of the masters at the
// cost of a 2-byte compensation buffer and a custom optimizer; kiln's optimizers are LibTorch's
// for now, so master weights it is.) Forward runs under bf16 autocast, so fp32 inputs are cast
// and losses stay fp32.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/io/state.hpp"
#include "kiln/precision/bf16.hpp"

namespace kiln::precision {

struct bf16_pure {
  using axis = kiln::axis::precision;
  static constexpr std::string_view kind = "bf16-pure";
  static constexpr bool always_finite = true;  // bf16 has fp32's range: no scale, no skipped step

  struct settings {
    template <class V>
    void describe(V&) {}
  };

  explicit bf16_pure(const settings& = {}) {}

  // Called by the accelerator before the optimizer is built: converts the model and returns
  // the fp32 masters the optimizer should own, under the same names.
  std::vector<std::pair<std::string, torch::Tensor>> prepare(
      torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
    torch::NoGradGuard no_grad;
    model_params_.clear();
    masters_.clear();
    std::vector<std::pair<std::string, torch::Tensor>> out;
    names_.clear();
    for (const auto& [name, p] : named) {
      auto master = p.detach().to(torch::kFloat32).clone().set_requires_grad(true);
      masters_.push_back(master);
      names_.push_back(name);
      out.emplace_back(name, master);
    }
    model.to(torch::kBFloat16);
    for (const auto& [name, p] : named) model_params_.push_back(p);  // same tensors, now bf16
    return out;
  }

  detail::device_autocast autocast() const { return detail::device_autocast(at::kBFloat16); }
  torch::Tensor scale(const torch::Tensor& loss) const { return loss; }

  // Moves the model's bf16 gradients into the masters' fp32 gradients (and frees the former).
  bool unscale_and_check(std::vector<torch::Tensor>& masters) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < model_params_.size(); ++i) {
      auto& g = model_params_[i].mutable_grad();
      if (!g.defined()) continue;
      auto& mg = masters[i].mutable_grad();
      if (mg.defined()) mg.copy_(g);
      else mg = g.to(torch::kFloat32);
      g = torch::Tensor();
    }
    return true;  // bf16 has fp32's range: overflow is not a scaling problem to recover from
  }
  void update(bool) {}

  // After the optimizer stepped the masters: round them into the model.
  void after_step() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < model_params_.size(); ++i) model_params_[i].copy_(masters_[i]);
  }

  // The masters are the true weights (the model holds their rounding): they are saved and
  // resumed, and loading them rounds them into the model again.
  void save_state(kiln::state_dict& state, const std::string& prefix) const {
    for (std::size_t i = 0; i < masters_.size(); ++i) state[prefix + "master/" + names_[i]] = masters_[i].detach().clone();
  }
  void load_state(const kiln::state_dict& state, const std::string& prefix) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(kiln::require(state, prefix + "master/" + names_[i]));
    after_step();
  }

  std::int64_t master_bytes() const {
    std::int64_t bytes = 0;
    for (const auto& m : masters_) bytes += m.numel() * 4;
    return bytes;
  }

 private:
  std::vector<std::string> names_;
  std::vector<torch::Tensor> model_params_;
  std::vector<torch::Tensor> masters_;
};

}  // namespace kiln::precision
