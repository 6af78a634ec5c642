// kiln/profiler/profile.hpp: the profiler axis's policy for everything but `none`.
//
// `profile<Collectors...>` runs a torch.profiler-like schedule over optimizer steps
// (wait, warmup, active, repeat) and drives one or more collectors: ops (per-operator time),
// trace (a Chrome/Perfetto trace), memory (allocator bytes per phase and step) and phases
// (wall time per phase with a verdict). `[profiler] kind = ["ops", "memory"]` selects
// profile<ops_collector, memory_collector>. During `wait` nothing is installed; during
// `warmup` the collectors run but keep nothing, so first-step effects do not skew results.
// At the end of fit() each collector prints its part of the report and writes its files.
//
// A collector provides:
//   static constexpr std::string_view kind;
//   explicit C(const profiler_settings&);
//   void set_mode(profile_mode);            off, warmup (run, keep nothing) or active
//   void begin(kiln::phase), end(kiln::phase), on_step_end(std::int64_t step)
//   void attach(const profile_context&)     optional
//   void report(profile_report&)            print and write its part
//   static constexpr bool holds_profiler_slot = true;   optional: it takes LibTorch's one profiler
//                                           slot while on (the memory meter), so it switches on first
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/concepts.hpp"
#include "kiln/errors.hpp"
#include "kiln/profiler/report_html.hpp"
#include "kiln/settings/fields.hpp"
#include "kiln/profiler/collector_kinds.hpp"

namespace kiln::profiler {

struct profiler_settings {
  std::int64_t wait = 1;    // steps with nothing installed
  std::int64_t warmup = 1;  // steps that run the collectors but keep nothing
  std::int64_t active = 5;  // steps recorded
  std::int64_t repeat = 1;  // wait-warmup-active cycles; 0 = until the run ends
  bool all_ranks = false;   // profile every rank, not only rank 0
  bool record_shapes = false;
  std::int64_t top = 20;  // rows of the printed op table
  bool print = true;      // print the report at the end (files are written either way)
  // The collectors that run, as "trace+phases"; empty: all of the policy's. Not a recipe field:
  // the CLI sets it when a recipe asks for fewer profilers than the combination it runs on has
  // (the every-profiler combination compiled for `kiln profile` serves any subset).
  std::string only;

  template <class V>
  void describe(V& v) {
    v.field("wait", wait, "steps with nothing installed at the start of each cycle", kiln::checks::non_negative);
    v.field("warmup", warmup, "steps that run the profiler but keep nothing", kiln::checks::non_negative);
    v.field("active", active, "steps recorded in each cycle", kiln::checks::positive);
    v.field("repeat", repeat, "wait-warmup-active cycles (0: until the run ends)", kiln::checks::non_negative);
    v.field("all_ranks", all_ranks, "profile every rank, not only rank 0");
    v.field("record_shapes", record_shapes, "split operator statistics by input shapes");
    v.field("top", top, "operators in the printed table", kiln::checks::positive);
    v.field("print", print, "print the report at the end of the run (files are written either way)");
  }
};

enum class profile_mode { off, warmup, active };

inline constexpr std::array<kiln::phase, 5> step_phases = {kiln::phase::data, kiln::phase::forward,
                                                           kiln::phase::backward, kiln::phase::optimizer,
                                                           kiln::phase::communication};

inline const char* phase_name(kiln::phase p) {
  switch (p) {
    case kiln::phase::data: return "data";
    case kiln::phase::forward: return "forward";
    case kiln::phase::backward: return "backward";
    case kiln::phase::optimizer: return "optimizer";
    case kiln::phase::communication: return "communication";
    case kiln::phase::evaluation: return "evaluation";
  }
  return "?";
}

// Where collectors put their results: the printed text goes to stderr as they write it; the
// files go to `dir` (when set); the HTML page is assembled from `html` at the end.
struct profile_report {
  std::filesystem::path dir;
  report_data html;
  std::vector<std::filesystem::path> files;
  bool quiet = false;
  void print(const std::string& text) const {
    if (!quiet) std::fprintf(stderr, "%s", text.c_str());
  }
};

namespace detail {

using clock = std::chrono::steady_clock;

inline double ms_since(clock::time_point start, clock::time_point end = clock::now()) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

// "ops+memory" from the collectors' kinds, as a constant the policy can expose as its `kind`.
template <class... Cs>
struct joined_kind {
  static constexpr std::size_t size = (std::size_t{0} + ... + Cs::kind.size()) + sizeof...(Cs) - 1;
  static constexpr std::array<char, size + 1> value = [] {
    std::array<char, size + 1> out{};
    std::size_t at = 0;
    bool first = true;
    auto append = [&](std::string_view k) {
      if (!first) out[at++] = '+';
      first = false;
      for (char c : k) out[at++] = c;
    };
    (append(Cs::kind), ...);
    return out;
  }();
};

}  // namespace detail

template <class... Collectors>
class profile {
  static_assert(sizeof...(Collectors) > 0, "kiln: profiler axis: profile<> needs at least one collector");

 public:
  using axis = kiln::axis::profiler;
  static constexpr bool enabled = true;
  static constexpr std::string_view kind{detail::joined_kind<Collectors...>::value.data(),
                                         detail::joined_kind<Collectors...>::size};
  using settings = profiler_settings;

  // Each collector is built in place from the settings: collectors register callbacks that
  // point at themselves, so they are never moved.
  explicit profile(const settings& s)
      : settings_(s), collectors_(((void)sizeof(Collectors), s)...), selected_{selected(Collectors::kind)...} {
    for_each_collector_kind(s.only, [](std::string_view wanted) {
      if (((wanted != Collectors::kind) && ...))
        throw config_error("[profiler] kind: \"" + std::string(wanted) + "\" is not compiled into this profiler (" +
                           std::string(kind) + ")");
    });
    apply(mode_for(0));
  }
  profile(const profile&) = delete;
  profile& operator=(const profile&) = delete;
  ~profile() { apply(profile_mode::off); }

  void attach(const profile_context& context) {
    participating_ = settings_.all_ranks || context.rank == 0;
    for_each([&](auto& c) {
      if constexpr (requires { c.attach(context); }) c.attach(context);
    });
    step_index_ = 0;
    apply(mode_for(0));
  }

  void begin(kiln::phase p) {
    if (mode_ != profile_mode::off) for_each([p](auto& c) { c.begin(p); });
  }
  void end(kiln::phase p) {
    if (mode_ != profile_mode::off) for_each([p](auto& c) { c.end(p); });
  }
  void on_step_end(std::int64_t step) {
    if (mode_ != profile_mode::off) for_each([step](auto& c) { c.on_step_end(step); });
    apply(mode_for(++step_index_));
  }

  // After the last step: every collector prints its part and writes its files into `dir`
  // (nothing is written when dir is empty), then the HTML page.
  void finish(const std::filesystem::path& dir) {
    apply(profile_mode::off);
    if (!participating_) return;
    profile_report report;
    report.dir = dir;
    report.quiet = !settings_.print;
    if (!dir.empty()) std::filesystem::create_directories(dir);
    report.html.title = "kiln profile";
    report.print("\n=== kiln profile (" + (settings_.only.empty() ? std::string(kind) : settings_.only) + ") ===\n");
    for_each([&](auto& c) { c.report(report); });
    if (!gradients_.empty()) {
      std::string text = "\ngradient health (last diagnostics step)\n";
      char line[160];
      for (const auto& g : gradients_) {
        std::snprintf(line, sizeof line, "  %-28s grad norm %10.3e  update/weight %10.3e  %s\n", g.module.c_str(),
                      g.grad_norm, g.update_ratio, g.finite ? "finite" : "NON-FINITE");
        text += line;
      }
      for (const auto& w : warnings_) text += "  warning: " + w + "\n";
      report.print(text);
      report.html.gradients = gradients_;
      report.html.warnings = warnings_;
    }
    if (!dir.empty()) {
      write_html(dir / "report.html", report.html);
      report.files.push_back(dir / "report.html");
      std::string list;
      for (const auto& f : report.files) list += "  " + f.string() + "\n";
      report.print("files:\n" + list);
    }
    last_report_ = report.html;
  }

  // The trainer's diagnostics, shown in the report when they ran.
  template <class Health>
  void set_gradient_health(const std::vector<Health>& rows, const std::vector<std::string>& warnings) {
    gradients_.clear();
    for (const auto& h : rows) gradients_.push_back({h.module, h.grad_norm, h.update_ratio, h.finite});
    warnings_ = warnings;
  }

  const report_data& last_report() const { return last_report_; }
  profile_mode mode() const { return mode_; }
  template <class C>
  C& collector() {
    return std::get<C>(collectors_);
  }

 private:
  profile_mode mode_for(std::int64_t index) const {
    if (!participating_) return profile_mode::off;
    const auto cycle = settings_.wait + settings_.warmup + settings_.active;
    if (settings_.repeat > 0 && index >= settings_.repeat * cycle) return profile_mode::off;
    const auto position = index % cycle;
    if (position < settings_.wait) return profile_mode::off;
    if (position < settings_.wait + settings_.warmup) return profile_mode::warmup;
    return profile_mode::active;
  }
  // Collectors that hold LibTorch's one profiler slot switch first: when warmup is 0 the memory
  // meter and the trace turn on in the same step, and the trace must then find the slot taken
  // (and leave Kineto out) rather than take it and leave the meter refusing to start.
  void apply(profile_mode mode) {
    if (mode == mode_) return;
    mode_ = mode;
    for_each([mode](auto& c) {
      if constexpr (holds_profiler_slot<std::remove_cvref_t<decltype(c)>>) c.set_mode(mode);
    });
    for_each([mode](auto& c) {
      if constexpr (!holds_profiler_slot<std::remove_cvref_t<decltype(c)>>) c.set_mode(mode);
    });
  }
  template <class C>
  static constexpr bool holds_profiler_slot = [] {
    if constexpr (requires { C::holds_profiler_slot; }) return C::holds_profiler_slot;
    else return false;
  }();
  bool selected(std::string_view collector) const {
    bool chosen = settings_.only.empty();
    for_each_collector_kind(settings_.only, [&](std::string_view wanted) { chosen = chosen || wanted == collector; });
    return chosen;
  }
  // Over the selected collectors only: the others are never switched on and report nothing.
  template <class F>
  void for_each(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((selected_[I] ? f(std::get<I>(collectors_)) : void()), ...);
    }(std::index_sequence_for<Collectors...>{});
  }

  settings settings_;
  std::tuple<Collectors...> collectors_;
  std::array<bool, sizeof...(Collectors)> selected_;
  profile_mode mode_ = profile_mode::off;
  std::int64_t step_index_ = 0;
  bool participating_ = true;
  report_data last_report_;
  std::vector<module_health> gradients_;
  std::vector<std::string> warnings_;
};

}  // namespace kiln::profiler
