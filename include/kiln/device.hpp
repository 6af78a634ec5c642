// kiln/device.hpp: where the model, its batches and the optimizer state live.
//
// A device is named as in PyTorch: "cpu", "cuda" (this rank's GPU) or "cuda:N", or "auto": this
// rank's GPU when LibTorch has CUDA and sees one, else the CPU. "This rank's GPU" is
// cuda:LOCAL_RANK (modulo the GPUs visible), so `kiln launch` and torchrun put one rank on
// each GPU of a machine, as torch DDP expects.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include "kiln/errors.hpp"

namespace kiln {

// The accepted spellings, for recipe checks and error messages.
inline constexpr std::string_view device_forms = "\"auto\", \"cpu\", \"cuda\" or \"cuda:N\"";

// auto, cpu, cuda or cuda:N. (Parsed by hand: std::regex here cost every translation unit that
// includes kiln a few seconds of compile time.)
inline bool is_device_name(std::string_view name) {
  if (name == "auto" || name == "cpu" || name == "cuda") return true;
  constexpr std::string_view prefix = "cuda:";
  if (!name.starts_with(prefix)) return false;
  const auto index = name.substr(prefix.size());
  return !index.empty() && index.size() <= 9 && std::ranges::all_of(index, [](char c) { return c >= '0' && c <= '9'; });
}

// `name` as a device this process can use, or a config_error that says why not. `where` names
// the setting in the message (a recipe field, say).
inline torch::Device resolve_device(const std::string& name, const std::string& where = "device") {
  if (!is_device_name(name))
    throw config_error(where + " = \"" + name + "\": expected " + std::string(device_forms));
  if (name == "cpu") return torch::kCPU;
  const bool cuda = torch::cuda::is_available();
  if (name == "auto" && !cuda) return torch::kCPU;
  if (!cuda)
    // CUDA builds of LibTorch register a CUDA device guard when their CUDA library loads.
    throw config_error(where + " = \"" + name + "\": " +
                       (c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) ? "no CUDA device is visible to this process"
                                                                             : "this LibTorch was built without CUDA") +
                       "; use \"cpu\", or \"auto\" to take a GPU only where there is one");
  const auto count = static_cast<std::int64_t>(torch::cuda::device_count());
  std::int64_t index = 0;
  if (const auto colon = name.find(':'); colon != std::string::npos) {
    index = std::stoll(name.substr(colon + 1));
    if (index >= count)
      throw config_error(where + " = \"" + name + "\": this process sees " + std::to_string(count) + " CUDA device" +
                         (count == 1 ? "" : "s") + " (cuda:0 to cuda:" + std::to_string(count - 1) + ")");
  } else if (const char* local_rank = std::getenv("LOCAL_RANK")) {
    index = std::atoll(local_rank) % count;
  }
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(index)};
}

// `t` on `device`: the same tensor when it is there already; from pinned host memory the copy is
// asynchronous (the caching host allocator keeps the buffer alive until the copy is done).
inline torch::Tensor to_device(const torch::Tensor& t, const torch::Device& device) {
  if (t.device() == device) return t;
  const bool non_blocking = device.is_cuda() && t.is_cpu() && t.is_pinned();
  return t.to(device, /*non_blocking=*/non_blocking);
}

}  // namespace kiln
