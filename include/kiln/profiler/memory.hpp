// kiln/profiler/memory.hpp: where the memory goes.
//
// A memory_meter (kiln/profiler/memory_meter.hpp) runs through the warmup and active steps;
// the collector reads it at every phase boundary: allocated bytes over time, the peak of each
// phase and of each step (above what was allocated when the step's first phase began, i.e.
// the batch, activations, gradients and temporaries), and the bytes held by parameters, gradients and optimizer state.
// On a CUDA build the same hook reports the CUDA caching allocator's allocations.
#pragma once

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/profiler/memory_meter.hpp"
#include "kiln/profiler/profile.hpp"

namespace kiln::profiler {

inline std::string format_bytes(double bytes) {
  char text[32];
  if (std::abs(bytes) >= 1 << 30) std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1 << 30));
  else if (std::abs(bytes) >= 1 << 20) std::snprintf(text, sizeof text, "%.2f MiB", bytes / (1 << 20));
  else if (std::abs(bytes) >= 1 << 10) std::snprintf(text, sizeof text, "%.1f KiB", bytes / (1 << 10));
  else std::snprintf(text, sizeof text, "%.0f B", bytes);
  return text;
}

class memory_collector {
 public:
  static constexpr std::string_view kind = "memory";
  static constexpr bool holds_profiler_slot = true;  // its meter reports through LibTorch's profiler slot
  static constexpr std::size_t count = step_phases.size();

  struct step_memory {
    std::int64_t step = 0;
    std::int64_t peak_bytes = 0;  // above the bytes allocated when the step began
    std::array<std::int64_t, count> phase_peak_bytes{};
  };

  explicit memory_collector(const profiler_settings&) {}
  memory_collector(const memory_collector&) = delete;

  void attach(const profile_context& context) { context_ = context; }

  void set_mode(profile_mode mode) {
    recording_ = mode == profile_mode::active;
    if (mode == profile_mode::off) meter_.stop();
    else if (!meter_.running()) meter_.start(), origin_ = detail::clock::now();
    step_started_ = false;
    current_ = {};
  }
  void begin(kiln::phase) {
    // The step's baseline is taken when its first phase begins, after whatever the previous
    // step left behind has been freed.
    if (!step_started_) step_base_ = meter_.current(), step_started_ = true;
    meter_.reset_peak();
  }
  void end(kiln::phase p) {
    const auto peak = meter_.peak();
    for (std::size_t i = 0; i < count; ++i)
      if (step_phases[i] == p) current_.phase_peak_bytes[i] = std::max(current_.phase_peak_bytes[i], peak - step_base_);
    current_.peak_bytes = std::max(current_.peak_bytes, peak - step_base_);
    if (recording_) timeline_.push_back({detail::ms_since(origin_), meter_.current() - step_base_, phase_name(p)});
  }
  void on_step_end(std::int64_t step) {
    current_.step = step;
    if (recording_) steps_.push_back(current_);
    current_ = {};
    step_started_ = false;
  }

  const std::vector<step_memory>& steps() const { return steps_; }
  std::int64_t peak_bytes() const {
    std::int64_t peak = 0;
    for (const auto& s : steps_) peak = std::max(peak, s.peak_bytes);
    return peak;
  }

  // Bytes held for the whole run: parameters, their gradients, optimizer state.
  std::vector<std::pair<std::string, std::int64_t>> held_bytes() const {
    std::int64_t params = 0, grads = 0;
    if (context_.model)
      for (const auto& p : context_.model->parameters()) {
        params += p.numel() * static_cast<std::int64_t>(p.element_size());
        if (p.grad().defined()) grads += p.grad().numel() * static_cast<std::int64_t>(p.grad().element_size());
      }
    const std::int64_t state = context_.optimizer_state_bytes ? context_.optimizer_state_bytes() : 0;
    return {{"parameters", params}, {"gradients", grads}, {"optimizer state", state}};
  }

  void report(profile_report& r) const {
    std::ostringstream out;
    char line[160];
    out << "\nmemory (allocated by LibTorch during the step, above its start; " << steps_.size() << " active steps)\n";
    std::array<std::int64_t, count> phase_peak{};
    for (const auto& s : steps_)
      for (std::size_t i = 0; i < count; ++i) phase_peak[i] = std::max(phase_peak[i], s.phase_peak_bytes[i]);
    for (std::size_t i = 0; i < count; ++i) {
      std::snprintf(line, sizeof line, "  peak in %-14s %12s\n", phase_name(step_phases[i]),
                    format_bytes(static_cast<double>(phase_peak[i])).c_str());
      out << line;
    }
    std::snprintf(line, sizeof line, "  peak of a step         %12s\n", format_bytes(static_cast<double>(peak_bytes())).c_str());
    out << line << "held for the run\n";
    for (const auto& [what, bytes] : held_bytes()) {
      std::snprintf(line, sizeof line, "  %-22s %12s\n", what.c_str(), format_bytes(static_cast<double>(bytes)).c_str());
      out << line;
    }
    r.print(out.str());

    r.html.memory = timeline_;
    r.html.peak_bytes = peak_bytes();
    r.html.held_bytes = held_bytes();
    if (r.dir.empty()) return;
    std::ofstream csv(r.dir / "memory.csv");
    csv << "step,peak_bytes";
    for (auto p : step_phases) csv << ',' << phase_name(p) << "_peak_bytes";
    csv << '\n';
    for (const auto& s : steps_) {
      csv << s.step << ',' << s.peak_bytes;
      for (auto b : s.phase_peak_bytes) csv << ',' << b;
      csv << '\n';
    }
    r.files.push_back(r.dir / "memory.csv");
  }

 private:
  profile_context context_;
  memory_meter meter_;
  bool recording_ = false;
  std::int64_t step_base_ = 0;
  bool step_started_ = false;
  detail::clock::time_point origin_ = detail::clock::now();
  step_memory current_{};
  std::vector<step_memory> steps_;
  std::vector<memory_sample> timeline_;
};

using memory = profile<memory_collector>;

}  // namespace kiln::profiler
