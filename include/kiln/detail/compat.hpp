// kiln/detail/compat.hpp: the one place where kiln bridges LibTorch 1.13 and 2.x.
//
// Differences are detected from the types themselves where possible (so a point release
// that changes them is followed automatically), and from TORCH_VERSION_* otherwise.
#pragma once

#include <string>
#include <type_traits>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace kiln::detail {

inline constexpr int torch_version_major = TORCH_VERSION_MAJOR;
inline constexpr int torch_version_minor = TORCH_VERSION_MINOR;

// Autocast state per device. LibTorch 2.4 replaced the per-device functions (set_cpu_enabled,
// set_autocast_cpu_dtype, ...) with ones taking the device type; the old names remain only as
// deprecated wrappers.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void set_autocast_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
inline at::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
inline bool autocast_enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
inline at::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) {
  if (d == c10::DeviceType::CPU) at::autocast::set_autocast_cpu_dtype(t);
  else at::autocast::set_autocast_gpu_dtype(t);
}
#endif

// Silences LibTorch's warnings (TORCH_WARN and the dispatcher's) for one scope. 2.0 turned the
// handler's interface from (location, message, verbatim) into one c10::Warning.
class quiet_warnings {
#if TORCH_VERSION_MAJOR >= 2
  struct handler : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  };
  handler handler_;
  c10::WarningUtils::WarningHandlerGuard guard_{&handler_};
#else
  struct handler : c10::WarningHandler {
    void process(const c10::SourceLocation&, const std::string&, const bool) override {}
  };
  handler handler_;
  c10::Warning::WarningHandlerGuard guard_{&handler_};
#endif
};

// An autocast region for one device and dtype, restoring the previous state when it ends and
// clearing the cast-weight cache when the outermost region ends (as torch.autocast does).
class autocast_scope {
 public:
  autocast_scope(c10::DeviceType device, at::ScalarType dtype)
      : device_(device), was_enabled_(autocast_enabled(device)), previous_dtype_(autocast_dtype(device)) {
    set_autocast_dtype(device, dtype);  // 1.13 throws on a dtype the backend does not support; 2.x does not check
    set_autocast_enabled(device, true);
    at::autocast::increment_nesting();
  }
  autocast_scope(const autocast_scope&) = delete;
  autocast_scope& operator=(const autocast_scope&) = delete;
  ~autocast_scope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_autocast_enabled(device_, was_enabled_);
    set_autocast_dtype(device_, previous_dtype_);
  }

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  at::ScalarType previous_dtype_;
};

// Why CPU autocast cannot train in float16 with this LibTorch, or "" when it can. 1.13's CPU
// autocast accepts only bfloat16 and it has no CPU float16 matmul; PyTorch 2.x has both. Found
// by trying rather than by version, once per process: a linear layer's forward and backward
// inside a float16 CPU autocast region.
inline std::string try_cpu_half_autocast() {
  try {
    torch::AutoGradMode grad_mode(true);
    auto weight = torch::ones({4, 4}, torch::requires_grad());
    autocast_scope region(c10::DeviceType::CPU, at::kHalf);
    auto out = torch::nn::functional::linear(torch::ones({2, 4}), weight);
    if (out.scalar_type() != at::kHalf)
      return std::string("a linear layer under float16 autocast gave ") + c10::toString(out.scalar_type());
    out.sum().backward();
    return {};
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    return why.substr(0, why.find('\n'));
  }
}
inline const std::string& cpu_half_autocast_failure() {
  static const std::string why = try_cpu_half_autocast();
  return why;
}

}  // namespace kiln::detail
