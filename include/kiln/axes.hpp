// kiln/axes.hpp: the policy axes, listed once.
//
// KILN_AXES(X) calls X(axis, default policy) once per axis, in the order policy packs, settings,
// recipes and messages list them. The policy pack (kiln/policies.hpp), the accelerator's settings
// and members (kiln/accelerator.hpp), recipe reading and writing (kiln/recipe/) and the axis tags
// below are all expanded from it, so adding an axis is a line here, plus what no list can say:
// its concept and member checks (kiln/concepts.hpp) and its default policy's header (included by
// kiln/policies.hpp, where the second column is used).
#pragma once

#include <string_view>

#define KILN_AXES(X)                              \
  X(precision, kiln::precision::fp32)             \
  X(accumulation, kiln::accumulation::steps)      \
  X(checkpointing, kiln::checkpointing::none)     \
  X(sharding, kiln::sharding::single)             \
  X(optimizer, kiln::optim::sgd)                  \
  X(profiler, kiln::profiler::none)

namespace kiln::axis {
// A policy names its axis with `using axis = kiln::axis::<name>;`.
#define KILN_DETAIL_AXIS_TAG(name_, default_) \
  struct name_ {                              \
    static constexpr std::string_view name = #name_; \
  };
KILN_AXES(KILN_DETAIL_AXIS_TAG)
#undef KILN_DETAIL_AXIS_TAG
}  // namespace kiln::axis
