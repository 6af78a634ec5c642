// kiln/checkpointing/every_nth.hpp: recompute every k-th block (blocks.0, blocks.k, ...).
//
// Between none and blocks: with k = 2, half the blocks keep their activations, so memory and
// the recompute cost both land about halfway.
#pragma once

#include <string_view>

#include "kiln/checkpointing/detail/select.hpp"
#include "kiln/concepts.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln::checkpointing {

struct every_nth {
  using axis = kiln::axis::checkpointing;
  static constexpr std::string_view kind = "every-nth";

  struct settings {
    std::int64_t every = 2;
    template <class V>
    void describe(V& v) {
      v.field("every", every, "checkpoint blocks.0, blocks.<every>, blocks.<2 every>, ...", kiln::checks::positive);
    }
  };

  explicit every_nth(const settings& s) : every_(s.every) {}

  void apply(torch::nn::Module& model) {
    const auto every = every_;
    auto selected = [every](const std::string& n) {
      auto index = detail::block_index(n);
      return index && *index % every == 0;
    };
    if (detail::checkpoint_selected(model, "every-nth", selected) == 0)
      throw config_error("checkpointing.kind = \"every-nth\": the model has no modules named blocks.N");
  }

 private:
  std::int64_t every_;
};

}  // namespace kiln::checkpointing
