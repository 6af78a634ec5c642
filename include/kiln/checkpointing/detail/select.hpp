// kiln/checkpointing/detail/select.hpp: what blocks, every-nth and selective share: switching
// checkpointing on for the modules whose names a rule selects.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "kiln/checkpointing/checkpoint.hpp"
#include "kiln/detail/glob.hpp"
#include "kiln/errors.hpp"

namespace kiln::checkpointing::detail {

// N for a module named "blocks.N" (a block of a model that names its blocks), else nothing.
inline std::optional<std::int64_t> block_index(const std::string& name) {
  const std::string prefix = "blocks.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const auto rest = name.substr(prefix.size());
  if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(rest);
}

// Turns checkpointing on for every selected module; returns how many. A selected module that
// cannot recompute its forward is an error naming it, not a silent no-op.
inline std::int64_t checkpoint_selected(torch::nn::Module& model, const std::string& kind,
                                        const std::function<bool(const std::string&)>& selected) {
  std::int64_t count = 0;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (!selected(item.key())) continue;
    auto* target = dynamic_cast<kiln::checkpointable*>(item.value().get());
    if (!target)
      throw config_error("checkpointing.kind = \"" + kind + "\" selects module " + item.key() +
                         ", which cannot recompute its forward (derive it from kiln::checkpointable)");
    target->set_checkpointed(true);
    ++count;
  }
  return count;
}

}  // namespace kiln::checkpointing::detail
