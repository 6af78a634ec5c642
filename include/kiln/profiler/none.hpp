// kiln/profiler/none.hpp: no profiling, the default of the profiler axis and the template
// for writing your own.
//
// Required members (kiln::profiler_policy in kiln/concepts.hpp):
//   enabled            false promises every hook is empty: the loop then skips the calls at
//                      compile time (if constexpr), so `none` costs nothing in the step;
//   begin(p), end(p)   around each phase (data, forward, backward, optimizer, ...);
//   on_step_end(step)  after each optimizer step.
// The accelerator calls them: backward() and step() time their own phases and end the step; a
// loop marks the rest with `auto scope = acc.phase(kiln::phase::data);`.
// Optional: attach(profiler::profile_context) (the model, rank and optimizer state size, from
// accelerator::prepare), finish(dir) (the report, at the end of fit()), and
// set_gradient_health(rows, warnings) (the diagnostics' last report, shown in it).
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/concepts.hpp"

namespace kiln::profiler {

struct none {
  using axis = kiln::axis::profiler;
  static constexpr std::string_view kind = "none";
  static constexpr bool enabled = false;

  struct settings {
    template <class V>
    void describe(V&) {}
  };

  explicit none(const settings& = {}) {}

  void begin(kiln::phase) {}
  void end(kiln::phase) {}
  void on_step_end(std::int64_t) {}
};

}  // namespace kiln::profiler
