// kiln/checkpointing/none.hpp: no activation checkpointing, the default of the checkpointing
// axis and the template for writing your own.
//
// Required member (kiln::checkpointing_policy in kiln/concepts.hpp):
//   apply(model)   called once by prepare(), before sharding places the parameters: wrap the
//                  sub-modules whose forward should be recomputed in backward.
// No optional members.
#pragma once

#include <string_view>

#include <torch/torch.h>

#include "kiln/concepts.hpp"

namespace kiln::checkpointing {

struct none {
  using axis = kiln::axis::checkpointing;
  static constexpr std::string_view kind = "none";

  struct settings {
    template <class V>
    void describe(V&) {}
  };

  explicit none(const settings& = {}) {}

  void apply(torch::nn::Module& /*model*/) {}
};

}  // namespace kiln::checkpointing
