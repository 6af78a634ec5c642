// kiln/precision/detail/cpu_bf16.hpp: what bf16 on the CPU needs beyond LibTorch's autocast.
//
// 1. Matmuls on CPUs whose LibTorch bf16 GEMM is a trap.
// LibTorch sends a CPU bf16 GEMM to oneDNN only where the CPU has AVX-512 BW, VL and DQ
// (mkldnn_bf16_device_check; oneDNN then accumulates in fp32, with AVX-512 BF16 dot products
// where the CPU has them). Everywhere else (AMD before Zen 4, Intel client CPUs) 1.13 runs a
// scalar loop that also accumulates in bf16: measured on an AMD EPYC (AVX2), a 512x1024 @
// 1024x1024 product took 17x fp32's time with a relative error of 3.7% (fp32 accumulation of the
// same bf16 inputs: 0.29%). Mixed precision there would be a 25x slower, less accurate run.
//
// While an fp32_cpu_matmuls lives, kiln's own kernels replace LibTorch's CPU kernels of mm,
// addmm, bmm and baddbmm (which linear, matmul and their backward passes all reach): for bf16
// operands they widen to fp32, call LibTorch's fp32 kernel (at::cpu::, no dispatch) and round
// the product to bf16; every other dtype goes straight to LibTorch's kernel. The replacement
// sits below autograd, so what backward keeps is still the bf16 tensors: the precision policy
// keeps its memory saving, and the matmuls run at fp32 speed with fp32 accumulation. The
// widening and rounding are kiln's vector loops (convert_kernel.hpp), not LibTorch's copy.
// Convolutions are not covered: they keep LibTorch's kernels.
//
// 2. LayerNorm on mixed dtypes. 1.13's CPU layer_norm wants input, weight and bias of one dtype,
// and its CPU autocast has no rule for it, so a LayerNorm fed by a bf16 activation (a Linear's
// output) throws "expected scalar type BFloat16 but found Float". 2.x takes a bf16 input with
// fp32 weights (and returns bf16), but still throws on the other mix, an fp32 input with bf16
// weights ("mixed dtype (CPU): expect parameter to have scalar type of Float": a bf16 model's
// LayerNorm fed fp32). The rule below casts weight and bias to the input's dtype where LibTorch
// cannot take the mix (their gradients flow back through the cast), so both versions take any.
#pragma once

#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/baddbmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/detail/compat.hpp"
#include "kiln/precision/detail/convert_kernel.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::precision {
// [precision] cpu_matmul of the bf16 policies: how bf16 matmuls run on the CPU.
enum class matmul_mode { automatic, fp32, bf16 };
constexpr auto choices(matmul_mode) {
  return std::to_array<kiln::choice<matmul_mode>>(
      {{"auto", matmul_mode::automatic}, {"fp32", matmul_mode::fp32}, {"bf16", matmul_mode::bf16}});
}
}  // namespace kiln::precision

namespace kiln::precision::detail {

// Whether LibTorch gives this CPU oneDNN's bf16 GEMM (fp32 accumulation, AVX-512 speed).
inline bool cpu_has_onednn_bf16_gemm() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool yes = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq");
  return yes;
#else
  return false;  // aarch64 with bf16 also has it; kiln has not been measured there
#endif
}

// Matmuls the replacement kernels have computed, for tests and reports.
inline std::atomic<std::int64_t>& fp32_cpu_matmul_calls() {
  static std::atomic<std::int64_t> calls{0};
  return calls;
}

namespace matmul_kernels {
inline bool both_bf16(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16;
}
inline at::Tensor wide(const at::Tensor& t) { return convert_cpu(t, at::kFloat); }
inline at::Tensor narrow(const at::Tensor& t) {
  fp32_cpu_matmul_calls().fetch_add(1, std::memory_order_relaxed);
  return convert_cpu(t, at::kBFloat16);
}

inline at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (!both_bf16(a, b)) return at::cpu::mm(a, b);
  return narrow(at::cpu::mm(wide(a), wide(b)));
}
inline at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  if (!both_bf16(a, b)) return at::cpu::bmm(a, b);
  return narrow(at::cpu::bmm(wide(a), wide(b)));
}
inline at::Tensor addmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                        const at::Scalar& alpha) {
  if (!both_bf16(a, b)) return at::cpu::addmm(c, a, b, beta, alpha);
  return narrow(at::cpu::addmm(wide(c), wide(a), wide(b), beta, alpha));
}
inline at::Tensor baddbmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                          const at::Scalar& alpha) {
  if (!both_bf16(a, b)) return at::cpu::baddbmm(c, a, b, beta, alpha);
  return narrow(at::cpu::baddbmm(wide(c), wide(a), wide(b), beta, alpha));
}
}  // namespace matmul_kernels

// One shared T per process while anyone holds it: the registrations below are process-wide, and
// the last owner's release puts LibTorch's own kernels back (the dispatcher keeps them under an
// override).
template <class T>
std::shared_ptr<const T> shared_while_held() {
  static std::mutex lock;
  static std::weak_ptr<const T> current;
  std::lock_guard guard(lock);
  if (auto live = current.lock()) return live;
  std::shared_ptr<const T> fresh(new T);
  current = fresh;
  return fresh;
}

// The matmul replacement, registered while any owner holds it.
class fp32_cpu_matmuls {
 public:
  static std::shared_ptr<const fp32_cpu_matmuls> acquire() { return shared_while_held<fp32_cpu_matmuls>(); }

 private:
  friend std::shared_ptr<const fp32_cpu_matmuls> shared_while_held<fp32_cpu_matmuls>();
  fp32_cpu_matmuls() : library_(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__) {
    kiln::detail::quiet_warnings quiet;  // "Overriding a previously registered kernel": that is the point
    library_.impl("mm", TORCH_FN(matmul_kernels::mm));
    library_.impl("bmm", TORCH_FN(matmul_kernels::bmm));
    library_.impl("addmm", TORCH_FN(matmul_kernels::addmm));
    library_.impl("baddbmm", TORCH_FN(matmul_kernels::baddbmm));
  }
  torch::Library library_;
};

// The autocast rule for layer_norm, registered while any owner holds it.
class layer_norm_autocast_rule {
 public:
  static std::shared_ptr<const layer_norm_autocast_rule> acquire() { return shared_while_held<layer_norm_autocast_rule>(); }

  static at::Tensor layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                               const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                               double eps, bool cudnn_enable) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    // 2.x's kernel takes a lower-precision input with fp32 weights itself (and keeps them fp32).
    const bool libtorch_takes_mix = kiln::detail::torch_version_major >= 2 && input.scalar_type() != at::kFloat;
    auto like_input = [&](const c10::optional<at::Tensor>& t) -> c10::optional<at::Tensor> {
      if (t && t->defined() && t->scalar_type() != input.scalar_type() && !libtorch_takes_mix)
        return t->to(input.scalar_type());
      return t;
    };
    return at::layer_norm(input, normalized_shape, like_input(weight), like_input(bias), eps, cudnn_enable);
  }

 private:
  friend std::shared_ptr<const layer_norm_autocast_rule> shared_while_held<layer_norm_autocast_rule>();
  layer_norm_autocast_rule() : library_(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__) {
    kiln::detail::quiet_warnings quiet;  // a LibTorch with a rule of its own gets this one instead
    library_.impl("layer_norm", TORCH_FN(layer_norm));
  }
  torch::Library library_;
};

// [precision] cpu_matmul, shared by the bf16 policies.
inline constexpr const char* cpu_matmul_help =
    "bf16 matmuls on the CPU: \"auto\" computes them in fp32 from the bf16 operands where LibTorch has no "
    "fast bf16 GEMM for this CPU (no AVX-512 BW/VL/DQ: its own is a scalar loop accumulating in bf16), "
    "\"fp32\" does so on every CPU, \"bf16\" always uses LibTorch's";

// What a bf16 policy holds for its lifetime: the matmul replacement where `cpu_matmul` asks for
// it, and the LayerNorm rule.
struct cpu_bf16_kernels {
  explicit cpu_bf16_kernels(matmul_mode cpu_matmul) {
    if (cpu_matmul == matmul_mode::fp32 || (cpu_matmul == matmul_mode::automatic && !cpu_has_onednn_bf16_gemm()))
      matmuls = fp32_cpu_matmuls::acquire();
    layer_norm = layer_norm_autocast_rule::acquire();
  }
  std::shared_ptr<const fp32_cpu_matmuls> matmuls;  // null: LibTorch's bf16 GEMM
  std::shared_ptr<const layer_norm_autocast_rule> layer_norm;
};

}  // namespace kiln::precision::detail
