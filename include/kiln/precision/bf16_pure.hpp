// kiln/precision/bf16_pure.hpp: bfloat16 parameters and activations, with fp32 master weights
// or Kahan-compensated bf16 updates.
//
// The model's parameters become bf16 (half the bytes of fp32 for weights, gradients and every
// activation). A bf16 weight has 8 bits of mantissa, so an update smaller than 1/256 of the
// weight would round away to nothing if it were simply applied in bf16. Two cures:
// - fp32 master weights (the default): the optimizer updates fp32 copies. Each sync step copies
//   the bf16 gradients into the masters' fp32 gradients, the optimizer steps the masters, and the
//   masters are rounded back into the model. Per parameter: 2 bytes of bf16 weight, 4 of master,
//   4 of master gradient, besides the optimizer's state.
// - `kahan = true`: no masters; the optimizer updates the bf16 weights themselves, summing each
//   update through a bf16 compensation buffer that keeps what rounding left out
//   (optim/detail/fused_loop.hpp's store_compensated; Zamirai et al. 2020, "Revisiting BFloat16
//   Training"). Per parameter: 2 bytes of weight, 2 of gradient, 2 of compensation: 4 bytes
//   fewer than the masters, and no copies between model and masters each step. The weight plus
//   its compensation carries 16 significant bits rather than the master's 24.
// Forward runs under bf16 autocast, so fp32 inputs are cast and losses stay fp32. CPU matmuls
// follow `cpu_matmul` as under bf16 (precision/bf16.hpp).
#pragma once

#include <memory>
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
    bool kahan = false;
    matmul_mode cpu_matmul = matmul_mode::automatic;
    template <class V>
    void describe(V& v) {
      v.field("kahan", kahan,
              "false: the optimizer updates fp32 master weights; true: no masters, it sums each update into the bf16 "
              "weight through a bf16 compensation buffer (Kahan summation; 4 bytes per parameter less)");
      v.field("cpu_matmul", cpu_matmul, detail::cpu_matmul_help);
    }
  };

  bf16_pure() : bf16_pure(settings{}) {}
  explicit bf16_pure(const settings& s) : kahan_(s.kahan), cpu_kernels_(s.cpu_matmul) {}

  // Asks the accelerator for an optimizer that updates the bf16 weights with Kahan summation.
  bool kahan_summation() const { return kahan_; }

  // Called by the accelerator before the optimizer is built: converts the model and returns
  // the fp32 masters the optimizer should own, under the same names (under Kahan summation, the
  // model's own parameters, now bf16).
  std::vector<std::pair<std::string, torch::Tensor>> prepare(
      torch::nn::Module& model, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
    torch::NoGradGuard no_grad;
    model_params_.clear();
    masters_.clear();
    names_.clear();
    if (kahan_) {
      model.to(torch::kBFloat16);  // the same tensors, now bf16
      return named;
    }
    std::vector<std::pair<std::string, torch::Tensor>> out;
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
  // Under Kahan summation there are no masters: the optimizer reads the bf16 gradients.
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

  // After the optimizer stepped the masters: round them into the model (no masters: nothing).
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
    for (std::size_t i = 0; i < masters_.size(); ++i) {
      const auto key = prefix + "master/" + names_[i];
      if (!state.count(key))
        throw kiln::state_error("saved state has no entry \"" + key + "\": it was saved without fp32 master weights "
                                "(bf16-pure with kahan = true?), and this run keeps them");
      masters_[i].copy_(state.at(key));
    }
    after_step();
  }

  std::int64_t master_bytes() const {
    std::int64_t bytes = 0;
    for (const auto& m : masters_) bytes += m.numel() * 4;
    return bytes;
  }

 private:
  bool kahan_ = false;
  detail::cpu_bf16_kernels cpu_kernels_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> model_params_;
  std::vector<torch::Tensor> masters_;
};

}  // namespace kiln::precision
