// kiln/models/gpt.hpp: a small decoder-only transformer language model (GPT-2 layout).
//
// Pre-LayerNorm blocks, learned positions, GPT-2 initialisation. Blocks live in a ModuleList
// named "blocks", so parameters are named "blocks.N.<...>": per-block policies (freezing,
// layer-wise learning rates, activation checkpointing) select blocks by that prefix.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "kiln/checkpointing/checkpoint.hpp"
#include "kiln/data/source.hpp"
#include "kiln/errors.hpp"
#include "kiln/models/dropout.hpp"
#include "kiln/models/gelu.hpp"
#include "kiln/models/layer_norm.hpp"
#include "kiln/models/linear.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::models {

// Also the [model] kind "gpt" of a recipe (kiln/recipe/components.hpp).
struct gpt_settings {
  static constexpr std::string_view kind = "gpt";
  std::int64_t vocab_size = 256;
  std::int64_t seq_len = 128;
  std::int64_t d_model = 128;
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t mlp_ratio = 4;
  double dropout = 0.1;

  template <class V>
  void describe(V& v) {
    v.field("vocab_size", vocab_size, "number of distinct tokens", checks::positive);
    v.field("seq_len", seq_len, "longest sequence the model accepts (size of the position table)",
            checks::positive);
    v.field("d_model", d_model, "width of the residual stream; must be divisible by n_head",
            checks::positive);
    v.field("n_layer", n_layer, "number of transformer blocks", checks::positive);
    v.field("n_head", n_head, "attention heads per block", checks::positive);
    v.field("mlp_ratio", mlp_ratio, "width of each block's MLP as a multiple of d_model",
            checks::positive);
    v.field("dropout", dropout, "dropout on embeddings, attention weights and residual branches",
            checks::in_range_open(0.0, 1.0));
  }

  // The model for a recipe's data; throws config_error when it does not fit it.
  torch::nn::AnyModule build(const data_info& data) const;
};

}  // namespace kiln::models

namespace kiln::detail {

inline models::gpt_settings checked_gpt_settings(models::gpt_settings settings) {
  auto errors = kiln::validate(settings, "model");
  if (errors.empty() && settings.d_model % settings.n_head != 0)
    errors.push_back("model.n_head: d_model (" + std::to_string(settings.d_model) +
                     ") must be divisible by n_head (" + std::to_string(settings.n_head) + ")");
  throw_if_invalid(errors);
  return settings;
}

}  // namespace kiln::detail

namespace kiln::models {

// Multi-head self-attention where position t sees only positions <= t.
class causal_self_attention_impl : public torch::nn::Module, public kiln::checkpointable {
 public:
  explicit causal_self_attention_impl(const gpt_settings& s)
      : n_head_(s.n_head), d_model_(s.d_model), seq_len_(s.seq_len) {
    qkv = register_module("qkv", torch::nn::Linear(s.d_model, 3 * s.d_model));
    proj = register_module("proj", torch::nn::Linear(s.d_model, s.d_model));
    attn_drop = register_module("attn_drop", kiln::models::dropout(s.dropout));
    resid_drop = register_module("resid_drop", kiln::models::dropout(s.dropout));
    set_body([this](const torch::Tensor& x) { return attend(x); });
  }

  // x: [B, T, d_model] -> [B, T, d_model]; recomputed in backward when checkpointed.
  torch::Tensor forward(const torch::Tensor& x) { return run_checkpointed(*this, x); }

  torch::Tensor attend(const torch::Tensor& x) {
    const std::int64_t b = x.size(0), t = x.size(1), hd = d_model_ / n_head_;
    auto parts = apply_linear(*qkv, x).split(d_model_, -1);
    auto heads = [&](const torch::Tensor& p) { return p.view({b, t, n_head_, hd}).transpose(1, 2); };
    auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    att = att.masked_fill(future_mask(x.device()).slice(0, 0, t).slice(1, 0, t),
                          -std::numeric_limits<double>::infinity());
    att = attn_drop->forward(torch::softmax(att, -1));
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, d_model_});
    return resid_drop->forward(apply_linear(*proj, y));
  }

  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  kiln::models::dropout attn_drop{nullptr}, resid_drop{nullptr};

 private:
  // Built once per device rather than registered as a buffer: a buffer would land in saved
  // states and be converted by module.to(dtype), which would turn the bool mask into floats.
  const torch::Tensor& future_mask(const torch::Device& device) {
    if (!mask_.defined() || mask_.device() != device)
      mask_ = torch::triu(torch::ones({seq_len_, seq_len_},
                                      torch::TensorOptions().dtype(torch::kBool).device(device)),
                          1);
    return mask_;
  }

  std::int64_t n_head_, d_model_, seq_len_;
  torch::Tensor mask_;
};
TORCH_MODULE_IMPL(causal_self_attention, causal_self_attention_impl);

class gpt_mlp_impl : public torch::nn::Module, public kiln::checkpointable {
 public:
  explicit gpt_mlp_impl(const gpt_settings& s) {
    fc = register_module("fc", torch::nn::Linear(s.d_model, s.mlp_ratio * s.d_model));
    proj = register_module("proj", torch::nn::Linear(s.mlp_ratio * s.d_model, s.d_model));
    drop = register_module("drop", kiln::models::dropout(s.dropout));
    set_body([this](const torch::Tensor& x) { return drop->forward(apply_linear(*proj, kiln::models::gelu(apply_linear(*fc, x)))); });
  }

  torch::Tensor forward(const torch::Tensor& x) { return run_checkpointed(*this, x); }

  torch::nn::Linear fc{nullptr}, proj{nullptr};
  kiln::models::dropout drop{nullptr};
};
TORCH_MODULE_IMPL(gpt_mlp, gpt_mlp_impl);

class gpt_block_impl : public torch::nn::Module, public kiln::checkpointable {
 public:
  explicit gpt_block_impl(const gpt_settings& s) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})));
    attn = register_module("attn", causal_self_attention(s));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})));
    mlp = register_module("mlp", gpt_mlp(s));
    set_body([this](const torch::Tensor& x) {
      auto h = x + attn->forward(apply_layer_norm(*ln1, x));
      return h + mlp->forward(apply_layer_norm(*ln2, h));
    });
  }

  // Recomputed in backward when a checkpointing policy selected this block.
  torch::Tensor forward(const torch::Tensor& x) { return run_checkpointed(*this, x); }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  causal_self_attention attn{nullptr};
  gpt_mlp mlp{nullptr};
};
TORCH_MODULE_IMPL(gpt_block, gpt_block_impl);

class gpt_impl : public torch::nn::Module {
 public:
  explicit gpt_impl(const gpt_settings& settings)
      : settings_(detail::checked_gpt_settings(settings)) {
    const auto& s = settings_;
    tok_emb = register_module("tok_emb", torch::nn::Embedding(s.vocab_size, s.d_model));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(s.seq_len, s.d_model));
    drop = register_module("drop", kiln::models::dropout(s.dropout));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < s.n_layer; ++i) blocks->push_back(gpt_block(s));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})));
    head = register_module(
        "head", torch::nn::Linear(torch::nn::LinearOptions(s.d_model, s.vocab_size).bias(false)));
    init_weights();
  }

  // tokens: int64 [B, T] with T <= seq_len. Returns logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& tokens) {
    if (tokens.dim() != 2)
      throw config_error("gpt: expected tokens of shape [B, T], got " +
                         std::to_string(tokens.dim()) + " dimensions");
    const std::int64_t t = tokens.size(1);
    if (t > settings_.seq_len)
      throw config_error("gpt: sequence length " + std::to_string(t) +
                         " exceeds model.seq_len (" + std::to_string(settings_.seq_len) + ")");
    auto positions = torch::arange(t, tokens.options().dtype(torch::kLong));
    auto x = drop->forward(tok_emb->forward(tokens) + pos_emb->forward(positions));
    for (const auto& block : *blocks) x = block->as<gpt_block_impl>()->forward(x);
    return apply_linear(*head, apply_layer_norm(*ln_f, x));
  }

  std::int64_t num_blocks() const { return settings_.n_layer; }
  const gpt_settings& settings() const { return settings_; }

  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  kiln::models::dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  // GPT-2: N(0, 0.02) everywhere, and the projections that write into the residual stream
  // scaled by 1/sqrt(2 * n_layer) so the stream's variance does not grow with depth.
  void init_weights() {
    torch::NoGradGuard no_grad;
    const double base_std = 0.02;
    const double proj_std = base_std / std::sqrt(2.0 * static_cast<double>(settings_.n_layer));
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* linear = module->as<torch::nn::LinearImpl>()) {
        linear->weight.normal_(0.0, base_std);
        if (linear->bias.defined()) linear->bias.zero_();
      } else if (auto* embedding = module->as<torch::nn::EmbeddingImpl>()) {
        embedding->weight.normal_(0.0, base_std);
      }
    }
    for (const auto& block : *blocks) {
      auto* b = block->as<gpt_block_impl>();
      b->attn->proj->weight.normal_(0.0, proj_std);
      b->mlp->proj->weight.normal_(0.0, proj_std);
    }
  }

  gpt_settings settings_;
};
TORCH_MODULE_IMPL(gpt, gpt_impl);

inline torch::nn::AnyModule gpt_settings::build(const data_info& data) const {
  if (!data.tokens())
    throw config_error("gpt predicts the next token but the data's samples are not token sequences (shape " +
                       data.shape_text() + ")");
  if (vocab_size < data.classes)
    throw config_error("model.vocab_size = " + std::to_string(vocab_size) + " but the data has " +
                       std::to_string(data.classes) + " distinct tokens; set model.vocab_size = " +
                       std::to_string(data.classes));
  if (seq_len < data.sample_shape.at(0))
    throw config_error("model.seq_len = " + std::to_string(seq_len) + " but the data's sequences are " +
                       std::to_string(data.sample_shape.at(0)) + " tokens long; set model.seq_len = " +
                       std::to_string(data.sample_shape.at(0)));
  return torch::nn::AnyModule(gpt(*this));
}

}  // namespace kiln::models
