// kiln/profiler/phases.hpp: wall time per phase per step, and what to do about it.
//
// The verdict names the phase that limits the step and the lever for it: input-bound (data
// takes >= 30% of the step), communication-bound (>= 30%), optimizer-bound (>= 35%),
// otherwise compute-bound (forward + backward). "other" is step time outside the phases
// (logging, evaluation, saving).
#pragma once

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/profiler/profile.hpp"

namespace kiln::profiler {

class phases_collector {
 public:
  static constexpr std::string_view kind = "phases";
  static constexpr std::size_t count = step_phases.size();

  struct step_times {
    std::int64_t step = 0;
    std::array<double, count> phase_ms{};
    double step_ms = 0;
  };

  explicit phases_collector(const profiler_settings&) {}

  void set_mode(profile_mode mode) {
    recording_ = mode == profile_mode::active;
    current_ = {};
    step_start_ = detail::clock::now();
  }
  void begin(kiln::phase p) { started_[index(p)] = detail::clock::now(); }
  void end(kiln::phase p) {
    if (index(p) < count) current_.phase_ms[index(p)] += detail::ms_since(started_[index(p)]);
  }
  void on_step_end(std::int64_t step) {
    const auto now = detail::clock::now();
    current_.step = step;
    current_.step_ms = detail::ms_since(step_start_, now);
    if (recording_) steps_.push_back(current_);
    current_ = {};
    step_start_ = now;
  }

  const std::vector<step_times>& steps() const { return steps_; }

  // Mean fraction of the step spent in each phase over the recorded steps.
  std::array<double, count> fractions() const {
    std::array<double, count> sum{};
    double total = 0;
    for (const auto& s : steps_) {
      for (std::size_t i = 0; i < count; ++i) sum[i] += s.phase_ms[i];
      total += s.step_ms;
    }
    for (auto& v : sum) v = total > 0 ? v / total : 0.0;
    return sum;
  }

  std::string verdict() const {
    if (steps_.empty()) return "no steps recorded: raise [train] steps above wait + warmup";
    const auto f = fractions();
    const double data = f[0], compute = f[1] + f[2], optimizer = f[3], communication = f[4];
    char text[256];
    if (data >= 0.30)
      std::snprintf(text, sizeof text,
                    "input-bound: %.0f%% of step time waiting for data - make the dataset faster or prefetch it "
                    "([data] workers)", 100 * data);
    else if (communication >= 0.30)
      std::snprintf(text, sizeof text,
                    "communication-bound: %.0f%% of step time in collectives - accumulate more micro-batches per "
                    "sync or overlap communication with backward", 100 * communication);
    else if (optimizer >= 0.35)
      std::snprintf(text, sizeof text,
                    "optimizer-bound: %.0f%% of step time in the optimizer step - a fused optimizer or a larger "
                    "batch amortises it", 100 * optimizer);
    else
      std::snprintf(text, sizeof text,
                    "compute-bound: forward + backward take %.0f%% of step time - mixed precision, a smaller model "
                    "or more threads shorten it", 100 * compute);
    return text;
  }

  void report(profile_report& r) const {
    std::ostringstream out;
    char line[256];
    out << "\nphase breakdown (mean over " << steps_.size() << " active steps)\n";
    const auto f = fractions();
    double step_ms = 0;
    std::array<double, count> mean_ms{};
    for (const auto& s : steps_) {
      step_ms += s.step_ms / steps_.size();
      for (std::size_t i = 0; i < count; ++i) mean_ms[i] += s.phase_ms[i] / steps_.size();
    }
    double other = 1.0;
    for (std::size_t i = 0; i < count; ++i) {
      std::snprintf(line, sizeof line, "  %-14s %9.3f ms %6.1f%%\n", phase_name(step_phases[i]), mean_ms[i],
                    100 * f[i]);
      out << line;
      other -= f[i];
    }
    std::snprintf(line, sizeof line, "  %-14s %9.3f ms %6.1f%%\n  %-14s %9.3f ms\n", "other", other * step_ms,
                  100 * other, "step", step_ms);
    out << line << "verdict: " << verdict() << "\n";
    r.print(out.str());

    r.html.verdict = verdict();
    r.html.phases.clear();
    for (auto p : step_phases) r.html.phases.push_back(phase_name(p));
    for (const auto& s : steps_) {
      r.html.steps.push_back(s.step);
      r.html.phase_ms.emplace_back(s.phase_ms.begin(), s.phase_ms.end());
    }
    if (r.dir.empty()) return;
    std::ofstream csv(r.dir / "phases.csv");
    csv << "step";
    for (auto p : step_phases) csv << ',' << phase_name(p) << "_ms";
    csv << ",step_ms\n";
    for (const auto& s : steps_) {
      csv << s.step;
      for (double v : s.phase_ms) csv << ',' << v;
      csv << ',' << s.step_ms << '\n';
    }
    r.files.push_back(r.dir / "phases.csv");
  }

 private:
  static std::size_t index(kiln::phase p) {
    for (std::size_t i = 0; i < count; ++i)
      if (step_phases[i] == p) return i;
    return count;  // evaluation: not part of a training step
  }

  bool recording_ = false;
  std::array<detail::clock::time_point, count + 1> started_{};
  step_times current_{};
  detail::clock::time_point step_start_ = detail::clock::now();
  std::vector<step_times> steps_;
};

using phases = profile<phases_collector>;

}  // namespace kiln::profiler
