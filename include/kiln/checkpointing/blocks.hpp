// kiln/checkpointing/blocks.hpp: recompute every block in backward.
//
// A model names its blocks "blocks.0", "blocks.1", ... (kiln's gpt does); each block then keeps
// only its input during forward, and activation memory falls from one set per block to one set
// for the block being recomputed, for about one extra forward per step.
#pragma once

#include <string_view>

#include "kiln/checkpointing/detail/select.hpp"
#include "kiln/concepts.hpp"

namespace kiln::checkpointing {

struct blocks {
  using axis = kiln::axis::checkpointing;
  static constexpr std::string_view kind = "blocks";

  struct settings {
    template <class V>
    void describe(V&) {}
  };

  explicit blocks(const settings& = {}) {}

  void apply(torch::nn::Module& model) {
    if (detail::checkpoint_selected(model, "blocks", [](const std::string& n) { return detail::block_index(n).has_value(); }) == 0)
      throw config_error("checkpointing.kind = \"blocks\": the model has no modules named blocks.N (gpt names its "
                         "blocks; mlp and cnn have none: use \"selective\" with module names)");
  }
};

}  // namespace kiln::checkpointing
