// kiln/detail/compat.hpp: the one place where kiln bridges LibTorch 1.13 and 2.x.
//
// Differences are detected from the types themselves where possible (so a point release
// that changes them is followed automatically), and from TORCH_VERSION_* otherwise.
#pragma once

#include <string>
#include <type_traits>

#include <torch/torch.h>
#include <torch/version.h>

namespace kiln::detail {

inline constexpr int torch_version_major = TORCH_VERSION_MAJOR;
inline constexpr int torch_version_minor = TORCH_VERSION_MINOR;

// The key LibTorch's optimizers use for a parameter's state: a string of the TensorImpl
// address in 1.13, the address itself (void*) in 2.x.
template <class StateMap>
auto optimizer_state_key(const StateMap&, const torch::Tensor& param) {
  using key_type = typename StateMap::key_type;
  if constexpr (std::is_same_v<key_type, std::string>)
    return c10::guts::to_string(param.unsafeGetTensorImpl());
  else
    return static_cast<key_type>(param.unsafeGetTensorImpl());
}

}  // namespace kiln::detail
