// kiln/schedule.hpp: learning-rate schedules as a factor of the optimizer's base lr.
//
// The factor for optimizer step s (0-based) of `total` steps: a linear warmup from ~0 to 1
// over `warmup_steps`, then constant, linear decay to `min_factor`, or half a cosine down to
// `min_factor` (the shapes of transformers' get_*_schedule_with_warmup). Pure function of the
// step, so resuming at step s gives exactly the lr an uninterrupted run had.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

#include "kiln/settings/fields.hpp"

namespace kiln {

struct schedule_settings {
  std::string kind = "constant";
  std::int64_t warmup_steps = 0;
  double min_factor = 0.0;  // lr at the end, as a fraction of the base lr (linear, cosine)

  template <class V>
  void describe(V& v) {
    v.field("kind", kind, "constant, linear or cosine (each after the warmup)",
            kiln::checks::one_of({"constant", "linear", "cosine"}));
    v.field("warmup_steps", warmup_steps, "optimizer steps of linear warmup", kiln::checks::non_negative);
    v.field("min_factor", min_factor, "final lr as a fraction of the base lr", kiln::checks::in_range(0.0, 1.0));
  }
};

inline double schedule_factor(const schedule_settings& s, std::int64_t step, std::int64_t total) {
  if (step < s.warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps + 1);
  if (s.kind == "constant") return 1.0;
  const auto decay_steps = std::max<std::int64_t>(1, total - s.warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - s.warmup_steps) / decay_steps, 0.0, 1.0);
  const double shape = s.kind == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return s.min_factor + (1.0 - s.min_factor) * shape;
}

}  // namespace kiln
