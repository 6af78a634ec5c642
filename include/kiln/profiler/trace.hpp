// kiln/profiler/trace.hpp: a Chrome/Perfetto trace of the active steps.
//
// kiln's phases (data, forward, backward, optimizer, communication) are ranges on the
// training thread, with LibTorch's operators and autograd functions nested inside them, so
// chrome://tracing or ui.perfetto.dev shows which phase each op belongs to. LibTorch 1.13 on
// Debian has no Kineto, so the events come from ATen's RecordFunction callbacks (CPU side;
// on a CUDA build, kernels appear at their launch, not their execution).
#pragma once

#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/profiler/detail/op_observer.hpp"
#include "kiln/profiler/profile.hpp"

namespace kiln::profiler {

class trace_collector : public detail::op_sink {
 public:
  static constexpr std::string_view kind = "trace";

  struct event {
    std::string name, category;
    double start_us, duration_us;
    std::uint64_t thread;
  };

  explicit trace_collector(const profiler_settings& s) : settings_(s) {}
  trace_collector(const trace_collector&) = delete;
  ~trace_collector() override { set_mode(profile_mode::off); }

  void set_mode(profile_mode mode) {
    recording_ = mode == profile_mode::active;
    if (recording_) step_start_ = detail::now_us();
    observe(mode != profile_mode::off, settings_.record_shapes);
  }
  void begin(kiln::phase p) { phase_start_[static_cast<int>(p)] = detail::now_us(); }
  void end(kiln::phase p) {
    if (!recording_) return;
    const double start = phase_start_[static_cast<int>(p)];
    std::lock_guard lock(mutex_);
    events_.push_back({phase_name(p), "kiln", start, detail::now_us() - start, detail::thread_number()});
  }
  void on_step_end(std::int64_t step) {
    if (!recording_) return;
    std::lock_guard lock(mutex_);
    const double now = detail::now_us();
    events_.push_back({"step " + std::to_string(step), "kiln", step_start_, now - step_start_, detail::thread_number()});
    step_start_ = now;
  }

  void on_op(const detail::op_event& e) override {
    if (!recording_) return;
    std::lock_guard lock(mutex_);
    events_.push_back({e.name + (e.shapes.empty() ? "" : " " + e.shapes), e.backward ? "autograd" : "op", e.start_us,
                       e.duration_us, e.thread});
  }

  const std::vector<event>& events() const { return events_; }

  // The trace as Chrome's JSON object format: complete ("X") events, microseconds.
  std::string json() const {
    std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
    bool first = true;
    for (const auto& e : events_) {
      std::string name;
      for (char c : e.name) {
        if (c == '"' || c == '\\') name += '\\';
        name += c;
      }
      char fields[160];
      std::snprintf(fields, sizeof fields, "\"ph\": \"X\", \"pid\": 1, \"tid\": %llu, \"ts\": %.3f, \"dur\": %.3f",
                    (unsigned long long)e.thread, e.start_us, e.duration_us);
      out += (first ? "\n" : ",\n") + std::string("{\"name\": \"") + name + "\", \"cat\": \"" + e.category + "\", " +
             fields + "}";
      first = false;
    }
    return out + "\n]}\n";
  }

  void report(profile_report& r) const {
    r.print("\ntrace: " + std::to_string(events_.size()) + " events" +
            (r.dir.empty() ? std::string(" (no run directory: not written)\n")
                           : " -> " + (r.dir / "trace.json").string() + " (open in ui.perfetto.dev or chrome://tracing)\n"));
    if (r.dir.empty()) return;
    std::ofstream(r.dir / "trace.json") << json();
    r.files.push_back(r.dir / "trace.json");
  }

 private:
  profiler_settings settings_;
  bool recording_ = false;
  std::mutex mutex_;
  double phase_start_[8] = {};
  double step_start_ = 0;
  std::vector<event> events_;
};

using trace = profile<trace_collector>;

}  // namespace kiln::profiler
