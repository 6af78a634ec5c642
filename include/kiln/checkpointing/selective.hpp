// kiln/checkpointing/selective.hpp: recompute the modules whose names match patterns.
//
//   [checkpointing]
//   kind = "selective"
//   modules = ["blocks.*.mlp"]      # '*' within a name segment, '**' across segments
//
// For the parts of a block whose activations are large and cheap to recompute (an MLP's
// 4x-wide hidden layer), while attention keeps its activations.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/checkpointing/detail/select.hpp"
#include "kiln/concepts.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::checkpointing {

struct selective {
  using axis = kiln::axis::checkpointing;
  static constexpr std::string_view kind = "selective";

  struct settings {
    std::vector<std::string> modules{"blocks.*.mlp"};
    template <class V>
    void describe(V& v) {
      v.field("modules", modules, "module name patterns ('*' within a segment, '**' across)", kiln::checks::not_empty);
    }
  };

  explicit selective(const settings& s) : patterns_(s.modules) {}

  void apply(torch::nn::Module& model) {
    auto selected = [this](const std::string& name) {
      for (const auto& p : patterns_)
        if (kiln::detail::glob_match(p.c_str(), name.c_str())) return true;
      return false;
    };
    if (detail::checkpoint_selected(model, "selective", selected) == 0) {
      std::string list;
      for (const auto& p : patterns_) list += (list.empty() ? "\"" : ", \"") + p + "\"";
      throw config_error("checkpointing.modules = [" + list + "] matches no module of the model");
    }
  }

 private:
  std::vector<std::string> patterns_;
};

}  // namespace kiln::checkpointing
