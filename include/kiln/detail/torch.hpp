// kiln/detail/torch.hpp: <torch/torch.h>, as kiln's public include and precompiled header take it.
//
// GCC 14 at -O3 reports -Wstringop-overflow inside LibTorch's own custom_function.h (the
// std::vector<bool>::reserve in Function<T>::apply, which kiln's activation checkpointing
// instantiates), a false positive seen with Debian 13's LibTorch 2.6. GCC takes the setting
// from where the template is defined, so the pragma wraps the include rather than kiln's call.
// A precompiled header does not keep the pragma: kiln_use_precompiled_torch() (cmake/kiln.cmake)
// passes -Wno-stringop-overflow to the targets that share kiln's.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
#include <torch/torch.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
