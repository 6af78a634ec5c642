// kiln/optim/adam8bit.hpp: AdamW with both moments stored in 8 bits (Dettmers et al. 2021,
// bitsandbytes' AdamW8bit): 2 bytes of state per parameter instead of 8.
//
// Each moment is quantized block-wise (blocks of 2048 elements, one fp32 absmax per block) with
// the dynamic tree map (signed for the first moment, unsigned for the second), see
// detail/quantize.hpp. One pass per block: dequantize both moments into fp32 buffers, apply
// adamw's arithmetic (detail::adam_rule), requantize against the block's new absmax. Tensors
// with fewer than min_8bit_size (4096) elements keep fp32 moments, as bitsandbytes does: their
// state is small and their updates (biases, norms) are the most sensitive.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/detail/kernels.hpp"
#include "kiln/optim/detail/fused_loop.hpp"
#include "kiln/optim/fused_optimizer.hpp"
#include "kiln/optim/detail/quantize.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::optim {

class adam8bit : public kiln::optim::fused_optimizer<adam8bit> {
 public:
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "adam8bit";
  // Its block quantisation is a CPU loop; no GPU kernel yet.
  static constexpr bool cpu_only = true;
  static constexpr std::int64_t block_size = 2048;

  struct settings {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
    std::int64_t min_8bit_size = 4096;
    std::vector<std::string> no_decay;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "learning rate (peak, before the schedule)", kiln::checks::positive);
      v.field("beta1", beta1, "decay of the first moment", kiln::checks::in_range_open(0.0, 1.0));
      v.field("beta2", beta2, "decay of the second moment", kiln::checks::in_range_open(0.0, 1.0));
      v.field("eps", eps, "added to the denominator", kiln::checks::positive);
      v.field("weight_decay", weight_decay, "decoupled weight decay", kiln::checks::non_negative);
      v.field("min_8bit_size", min_8bit_size, "tensors with fewer elements keep fp32 moments",
              kiln::checks::non_negative);
      v.field("no_decay", no_decay, kiln::optim::no_decay_help);
    }
  };

  explicit adam8bit(const settings& s) : fused_optimizer(s.lr, s.weight_decay, s.no_decay), settings_(s) {}

  double base_lr() const { return settings_.lr; }

  bool quantized(const kiln::optim::slot& s) const { return s.param.numel() >= settings_.min_8bit_size; }

  void init_state(kiln::optim::slot& s) const {
    const auto n = s.param.numel();
    if (!quantized(s)) {
      auto zeros = [&] { return torch::zeros(s.param.sizes(), torch::kFloat32); };
      s.state = {{"exp_avg", zeros()}, {"exp_avg_sq", zeros()}};
      return;
    }
    const auto blocks = (n + block_size - 1) / block_size;
    // Code of 0.0 in each map, so that a fresh state dequantizes to zeros.
    const auto zero_signed = detail::signed_map().encode(0.0f), zero_unsigned = detail::unsigned_map().encode(0.0f);
    s.state = {{"exp_avg_code", torch::full({n}, zero_signed, torch::kUInt8)},
               {"exp_avg_absmax", torch::zeros({blocks}, torch::kFloat32)},
               {"exp_avg_sq_code", torch::full({n}, zero_unsigned, torch::kUInt8)},
               {"exp_avg_sq_absmax", torch::zeros({blocks}, torch::kFloat32)}};
  }

  // Compiled once, in kiln::kernels (kiln/detail/kernels.hpp).
  void update(kiln::optim::slot& s, const torch::Tensor& grad) const;

 private:
  settings settings_;
};

}  // namespace kiln::optim

#if KILN_KERNEL_DEFINITIONS
#include <ATen/Parallel.h>

#include "kiln/optim/detail/adam_rule.hpp"

KILN_KERNEL_ENTRY void kiln::optim::adam8bit::update(kiln::optim::slot& s, const torch::Tensor& grad) const {
  const detail::adam_rule rule(lr(), s.weight_decay, settings_.beta1, settings_.beta2, settings_.eps,
                               static_cast<double>(s.step));
  dispatch(s.param, [&](auto type) {
    using T = decltype(type);
    T* p = s.param.data_ptr<T>();
    c10::BFloat16* c = compensation_ptr(s);
    const T* g = grad.data_ptr<T>();
    if (!quantized(s)) {
      detail::fused_loop(s.param.numel(), rule, p, c, g, s.field(0).data_ptr<float>(), s.field(1).data_ptr<float>());
      return;
    }
    std::uint8_t* m_code = s.field(0).data_ptr<std::uint8_t>();
    float* m_absmax = s.field(1).data_ptr<float>();
    std::uint8_t* v_code = s.field(2).data_ptr<std::uint8_t>();
    float* v_absmax = s.field(3).data_ptr<float>();
    const auto n = s.param.numel();
    const auto blocks = (n + block_size - 1) / block_size;
    const auto& signed_map = detail::signed_map();
    const auto& unsigned_map = detail::unsigned_map();
    at::parallel_for(0, blocks, 4, [&](std::int64_t first, std::int64_t last) {
      float m[block_size], v[block_size];
      for (std::int64_t b = first; b < last; ++b) {
        const auto begin = b * block_size, len = std::min(block_size, n - begin);
        detail::dequantize_block(m_code + begin, len, m_absmax[b], m, signed_map);
        detail::dequantize_block(v_code + begin, len, v_absmax[b], v, unsigned_map);
        detail::fused_serial(0, len, rule, p + begin, c ? c + begin : nullptr, g + begin, m, v);
        m_absmax[b] = detail::quantize_block(m, len, m_code + begin, signed_map);
        v_absmax[b] = detail::quantize_block(v, len, v_code + begin, unsigned_map);
      }
    });
  });
}
#endif
