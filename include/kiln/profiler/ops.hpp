// kiln/profiler/ops.hpp: where the time goes, per LibTorch operator.
//
// Aggregates every operator and autograd function of the active steps by name (and by input
// shapes with record_shapes): calls, total time, self time (total minus the operators it
// called). Prints the top rows by self time and writes ops.csv and ops.json.
#pragma once

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/profiler/detail/op_observer.hpp"
#include "kiln/profiler/profile.hpp"

namespace kiln::profiler {

struct op_stats {
  std::string name;
  std::string shapes;
  std::int64_t calls = 0;
  double total_us = 0;
  double self_us = 0;
};

class ops_collector : public detail::op_sink {
 public:
  static constexpr std::string_view kind = "ops";

  explicit ops_collector(const profiler_settings& s) : settings_(s) {}
  ops_collector(const ops_collector&) = delete;
  ~ops_collector() override { set_mode(profile_mode::off); }

  void set_mode(profile_mode mode) {
    recording_ = mode == profile_mode::active;  // warmup runs the callbacks and keeps nothing
    observe(mode != profile_mode::off, settings_.record_shapes);
  }
  void begin(kiln::phase) {}
  void end(kiln::phase) {}
  void on_step_end(std::int64_t) {
    if (recording_) ++steps_;
  }

  void on_op(const detail::op_event& e) override {
    if (!recording_) return;
    auto& s = stats_[e.name + e.shapes];
    if (s.calls == 0) s.name = e.name, s.shapes = e.shapes;
    ++s.calls;
    s.total_us += e.duration_us;
    s.self_us += e.self_us;
  }

  // Sorted by self time, the most expensive first.
  std::vector<op_stats> table() const {
    std::vector<op_stats> rows;
    for (const auto& [key, s] : stats_) rows.push_back(s);
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.self_us > b.self_us; });
    return rows;
  }
  std::int64_t calls(const std::string& name) const {
    std::int64_t n = 0;
    for (const auto& [key, s] : stats_)
      if (s.name == name) n += s.calls;
    return n;
  }
  std::int64_t recorded_steps() const { return steps_; }
  void clear() { stats_.clear(), steps_ = 0; }

  void report(profile_report& r) const {
    auto rows = table();
    double self_total = 0;
    for (const auto& s : rows) self_total += s.self_us;
    std::ostringstream out;
    char line[256];
    std::snprintf(line, sizeof line, "\ntop operators by self time (%lld active steps)\n%-44s %8s %12s %12s %7s\n",
                  (long long)steps_, "operator", "calls", "self ms", "total ms", "self %");
    out << line;
    for (std::size_t i = 0; i < rows.size() && i < static_cast<std::size_t>(settings_.top); ++i) {
      const auto& s = rows[i];
      std::snprintf(line, sizeof line, "%-44s %8lld %12.3f %12.3f %6.1f%%\n",
                    (s.name + (s.shapes.empty() ? "" : " " + s.shapes)).substr(0, 44).c_str(), (long long)s.calls,
                    s.self_us / 1e3, s.total_us / 1e3, self_total > 0 ? 100.0 * s.self_us / self_total : 0.0);
      out << line;
      r.html.top_ops.push_back({s.name + (s.shapes.empty() ? "" : " " + s.shapes), s.calls, s.total_us / 1e3,
                                s.self_us / 1e3});
    }
    r.print(out.str());
    if (r.dir.empty()) return;
    {
      std::ofstream csv(r.dir / "ops.csv");
      csv << "operator,shapes,calls,self_ms,total_ms\n";
      for (const auto& s : rows)
        csv << '"' << s.name << "\",\"" << s.shapes << "\"," << s.calls << ',' << s.self_us / 1e3 << ','
            << s.total_us / 1e3 << '\n';
    }
    {
      std::ofstream json(r.dir / "ops.json");
      json << "{\"steps\": " << steps_ << ", \"ops\": [";
      for (std::size_t i = 0; i < rows.size(); ++i)
        json << (i ? ",\n  " : "\n  ") << "{\"name\": \"" << rows[i].name << "\", \"shapes\": \"" << rows[i].shapes
             << "\", \"calls\": " << rows[i].calls << ", \"self_ms\": " << rows[i].self_us / 1e3
             << ", \"total_ms\": " << rows[i].total_us / 1e3 << "}";
      json << "\n]}\n";
    }
    r.files.push_back(r.dir / "ops.csv");
    r.files.push_back(r.dir / "ops.json");
  }

 private:
  profiler_settings settings_;
  bool recording_ = false;
  std::int64_t steps_ = 0;
  std::map<std::string, op_stats> stats_;
};

using ops = profile<ops_collector>;

}  // namespace kiln::profiler
