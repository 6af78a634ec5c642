// kiln/profiler/trace.hpp: a Chrome/Perfetto trace of the active steps.
//
// kiln's phases (data, forward, backward, optimizer, communication) are ranges on the
// training thread, with LibTorch's operators and autograd functions nested inside them, so
// chrome://tracing or ui.perfetto.dev shows which phase each op belongs to. The events come
// from ATen's RecordFunction callbacks (CPU side; on a CUDA build, kernels appear at their
// launch, not their execution), which every LibTorch has.
//
// Where LibTorch has Kineto (PyTorch's 2.x builds; not Debian's 1.13), the first active cycle
// is also recorded by Kineto into trace-kineto.json, torch.profiler's own trace, with the CUDA
// kernels and copies where they ran; kiln's phases appear in it as user annotations
// (RecordFunction ranges of USER_SCOPE, which kiln's own collectors ignore). Kineto and the
// `memory` profiler need the same per-thread slot of LibTorch's (kiln/profiler/detail/kineto.hpp),
// so with "memory" selected too the trace comes from RecordFunction alone, and the report says so.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "kiln/profiler/detail/kineto.hpp"
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
    const bool was_recording = recording_;
    recording_ = mode == profile_mode::active;
    if (recording_ && !was_recording && !kineto_tried_) {
      if (!detail::kineto_session::slot_free()) {
        kineto_blocked_ = true;  // the memory profiler's meter runs in these steps
      } else if (detail::kineto_session::available()) {
        kineto_tried_ = true;
        kineto_.emplace(settings_.record_shapes);
      }
    }
    if (!recording_ && kineto_) finish_kineto();
    if (recording_) step_start_ = detail::now_us();
    observe(mode != profile_mode::off, settings_.record_shapes);
  }
  void begin(kiln::phase p) {
    phase_start_[static_cast<int>(p)] = detail::now_us();
    if (kineto_) {
      auto& range = kineto_ranges_[static_cast<int>(p)];
      range.emplace(at::RecordScope::USER_SCOPE);
      if (range->isActive()) range->before(phase_name(p));
    }
  }
  void end(kiln::phase p) {
    if (kineto_) kineto_ranges_[static_cast<int>(p)].reset();
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
  // Whether Kineto records now (in an active cycle, where this LibTorch has it and the memory
  // meter does not hold the profiler slot).
  bool kineto_recording() const { return kineto_.has_value(); }

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

  void report(profile_report& r) {
    if (kineto_) finish_kineto();  // the run ended inside an active cycle
    r.print("\ntrace: " + std::to_string(events_.size()) + " events" +
            (r.dir.empty() ? std::string(" (no run directory: not written)\n")
                           : " -> " + (r.dir / "trace.json").string() + " (open in ui.perfetto.dev or chrome://tracing)\n"));
    if (kineto_file_) {
      if (r.dir.empty()) {
        std::filesystem::remove(*kineto_file_);
      } else {
        std::filesystem::copy_file(*kineto_file_, r.dir / "trace-kineto.json",
                                   std::filesystem::copy_options::overwrite_existing);
        std::filesystem::remove(*kineto_file_);
        r.print("trace: Kineto's trace of the first active cycle -> " + (r.dir / "trace-kineto.json").string() + "\n");
        r.files.push_back(r.dir / "trace-kineto.json");
      }
      kineto_file_.reset();
    } else if (kineto_tried_) {
      r.print("trace: Kineto recorded, but its trace could not be written (the error is above)\n");
    } else if (detail::kineto_session::slot_free() && !detail::kineto_session::available()) {
      r.print("trace: this LibTorch has no Kineto: operators as RecordFunction sees them, on the CPU\n");
    } else if (kineto_blocked_) {
      r.print("trace: Kineto not used: the memory profiler's meter holds LibTorch's one profiler slot in these steps "
              "and the two cannot record together; for Kineto's trace (CUDA kernels and copies) leave \"memory\" out, "
              "e.g. --set 'profiler.kind=[\"trace\", \"phases\"]'\n");
    }
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
  std::optional<detail::kineto_session> kineto_;
  std::optional<at::RecordFunction> kineto_ranges_[8];
  std::optional<std::filesystem::path> kineto_file_;  // Kineto's trace, until report() moves it
  bool kineto_blocked_ = false;
  bool kineto_tried_ = false;                          // Kineto records the first active cycle only

  // Ends the Kineto session into a file of its own until report(). A trace that cannot be
  // written costs the Kineto file, not the training run.
  void finish_kineto() {
    for (auto& range : kineto_ranges_) range.reset();
    const auto file = std::filesystem::temp_directory_path() /
                      ("kiln-kineto-" + std::to_string(::getpid()) + "-" +
                       std::to_string(reinterpret_cast<std::uintptr_t>(this)) + ".json");
    try {
      kineto_->save(file);
      kineto_file_ = file;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln: profiler: Kineto's trace could not be written (%s)\n", e.what());
    }
    kineto_.reset();
  }
};

using trace = profile<trace_collector>;

}  // namespace kiln::profiler
