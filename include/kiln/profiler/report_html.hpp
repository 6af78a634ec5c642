// kiln/profiler/report_html.hpp: turns a profile (phase times per step, top operators, memory
// over time, gradient health) into one self-contained HTML page that a person can open anywhere.
//
// The page makes no network request: no scripts, fonts or stylesheets are loaded, the plots are
// inline SVG written here, and a Content-Security-Policy forbids fetching anything. That keeps a
// report readable on an air-gapped cluster and safe to attach to a bug report. Every string from
// the report (op names, module names, warnings) is HTML-escaped. Only the standard library is used.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "kiln/errors.hpp"

namespace kiln::profiler {

struct op_row {
  std::string name;
  std::int64_t calls = 0;
  double total_ms = 0;
  double self_ms = 0;
};

struct memory_sample {
  double time_ms = 0;
  std::int64_t bytes = 0;
  std::string phase;
};

struct module_health {
  std::string module;
  double grad_norm = 0;
  double update_ratio = 0;
  bool finite = true;
};

struct report_data {
  std::string title;                                             // "kiln profile: profiling (gpt)"
  std::vector<std::string> phases;                               // data, forward, backward, ...
  std::vector<std::int64_t> steps;                               // profiled step numbers
  std::vector<std::vector<double>> phase_ms;                     // [step][phase] wall ms
  std::string verdict;                                           // one-line diagnosis
  std::vector<op_row> top_ops;                                   // by self time, descending
  std::vector<memory_sample> memory;                             // allocated bytes over time
  std::int64_t peak_bytes = 0;
  std::vector<std::pair<std::string, std::int64_t>> held_bytes;  // parameters, gradients, ...
  std::vector<module_health> gradients;                          // may be empty
  std::vector<std::string> warnings;
};

// Fill colour of phase i (phase i uses phase_colours[i % size]). Fixed, so a reader learns them
// once and a screenshot test can count their pixels; the first five are far apart in hue so the
// usual data/forward/backward/optimizer/communication never look alike.
inline constexpr std::array<std::string_view, 10> phase_colours = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
// Memory chart: an opaque area under a darker line (opaque so its colour is exact on screen).
inline constexpr std::string_view memory_area_colour = "#d4c4ea";
inline constexpr std::string_view memory_line_colour = "#5b2c8f";
inline constexpr std::string_view peak_colour = "#c4161c";

namespace html_detail {  // own namespace: profiler::detail is shared by other headers

// ---- text -------------------------------------------------------------------------------------

// Escapes the five characters that matter in HTML text and attribute values, and drops control
// characters (a stray NUL in an op name must not corrupt the page).
inline std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') break;
        out += c;
    }
  }
  return out;
}

// Numbers go through to_chars, never printf or streams: a program that set a locale must not get
// "1,5" in an SVG coordinate.
inline std::string fixed(double value, int precision) {
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  std::array<char, 64> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value,
                                 std::chars_format::fixed, precision);
  if (ec != std::errc{}) return "?";
  std::string s(buf.data(), end);
  if (s.front() == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);  // "-0.0"
  return s;
}

inline std::string scientific(double value, int precision) {
  if (!std::isfinite(value)) return fixed(value, 0);
  std::array<char, 64> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value,
                                 std::chars_format::scientific, precision);
  return ec == std::errc{} ? std::string(buf.data(), end) : "?";
}

// Plain decimals where they read well (0.412, 13.8), powers of ten outside that range.
inline std::string readable(double value) {
  double a = std::abs(value);
  if (a == 0) return "0";
  if (a >= 0.01 && a < 10000) return fixed(value, a < 1 ? 4 : a < 100 ? 3 : 1);
  return scientific(value, 2);
}

// 1234567 -> "1,234,567": call counts are easier to compare with separators.
inline std::string grouped(std::int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

// A byte unit (binary, as allocators count) chosen so the largest value reads as 1..1023.
struct byte_unit {
  double scale;
  std::string_view name;
};

inline byte_unit unit_for(double max_bytes) {
  constexpr std::array<byte_unit, 5> units = {
      byte_unit{1.0, "B"}, byte_unit{1024.0, "KiB"}, byte_unit{1048576.0, "MiB"},
      byte_unit{1073741824.0, "GiB"}, byte_unit{1099511627776.0, "TiB"}};
  std::size_t i = 0;
  while (i + 1 < units.size() && max_bytes >= units[i + 1].scale) ++i;
  return units[i];
}

inline std::string bytes_text(double bytes) {
  auto unit = unit_for(std::abs(bytes));
  return fixed(bytes / unit.scale, unit.scale == 1.0 ? 0 : 1) + " " + std::string(unit.name);
}

inline std::string colour_of_phase(std::size_t index) {
  return std::string(phase_colours[index % phase_colours.size()]);
}

// A value safe to draw: NaN, infinities and negatives (clock skew) become 0 rather than
// stretching an axis to infinity.
inline double drawable(double value) { return std::isfinite(value) && value > 0 ? value : 0.0; }

// ---- axes -------------------------------------------------------------------------------------

// A "nice" axis: ticks at 1, 2 or 5 times a power of ten, the top tick at or above the data.
struct axis_scale {
  double step;
  double top;
};

inline axis_scale nice_axis(double max_value, int target_ticks = 5) {
  if (!(max_value > 0) || !std::isfinite(max_value)) return {1.0, 1.0};
  double raw = max_value / target_ticks;
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double norm = raw / magnitude;
  double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * magnitude;
  return {step, std::ceil(max_value / step - 1e-9) * step};
}

// Digits after the point needed to tell ticks `step` apart (0.25 -> 2, 50 -> 0).
inline int tick_precision(double step) {
  if (step >= 1) return 0;
  return std::min(6, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
}

// The plot rectangle inside an SVG of a fixed size; margins leave room for labels and legend.
struct plot_box {
  double width, height;              // whole SVG
  double left, right, top, bottom;   // margins
  double x0() const { return left; }
  double x1() const { return width - right; }
  double y0() const { return height - bottom; }  // the baseline (SVG y grows downwards)
  double y1() const { return top; }
  double plot_w() const { return x1() - x0(); }
  double plot_h() const { return y0() - y1(); }
};

inline std::string svg_open(std::string_view id, const plot_box& box, std::string_view label) {
  return "<svg id=\"" + std::string(id) + "\" class=\"chart\" width=\"" + fixed(box.width, 0) +
         "\" height=\"" + fixed(box.height, 0) + "\" viewBox=\"0 0 " + fixed(box.width, 0) + " " +
         fixed(box.height, 0) + "\" role=\"img\" aria-label=\"" + escape_html(label) + "\">\n";
}

inline std::string svg_text(double x, double y, std::string_view text, std::string_view cls,
                            std::string_view anchor = "middle") {
  return "<text x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y, 1) + "\" class=\"" +
         std::string(cls) + "\" text-anchor=\"" + std::string(anchor) + "\">" + escape_html(text) +
         "</text>\n";
}

inline std::string svg_line(double x1, double y1, double x2, double y2, std::string_view cls) {
  return "<line x1=\"" + fixed(x1, 1) + "\" y1=\"" + fixed(y1, 1) + "\" x2=\"" + fixed(x2, 1) +
         "\" y2=\"" + fixed(y2, 1) + "\" class=\"" + std::string(cls) + "\"/>\n";
}

// Horizontal grid lines with their value labels on the left, and the y-axis title rotated.
inline std::string y_axis(const plot_box& box, const axis_scale& scale, double unit_divisor,
                          std::string_view title) {
  std::string out = "<g class=\"y-axis\">\n";
  int precision = tick_precision(scale.step / unit_divisor);
  for (double v = 0; v <= scale.top + scale.step * 1e-6; v += scale.step) {
    double y = box.y0() - v / scale.top * box.plot_h();
    out += svg_line(box.x0(), y, box.x1(), y, v == 0 ? "axis" : "grid");
    out += svg_text(box.x0() - 8, y + 4, fixed(v / unit_divisor, precision), "tick", "end");
  }
  double cx = 16, cy = box.y1() + box.plot_h() / 2;
  out += "<text class=\"axis-title\" text-anchor=\"middle\" transform=\"translate(" + fixed(cx, 1) +
         "," + fixed(cy, 1) + ") rotate(-90)\">" + escape_html(title) + "</text>\n";
  return out + "</g>\n";
}

// A row of colour swatches with names, drawn across the top margin of a chart.
inline std::string legend(const std::vector<std::pair<std::string, std::string>>& items,
                          double x, double y) {
  std::string out = "<g class=\"legend\">\n";
  for (const auto& [colour, label] : items) {
    if (colour.empty()) {  // a caption for the swatches that follow
      out += svg_text(x, y + 1, label, "legend-caption", "start");
      x += 6.5 * static_cast<double>(label.size()) + 10;
      continue;
    }
    out += "<rect x=\"" + fixed(x, 1) + "\" y=\"" + fixed(y - 11, 1) +
           "\" width=\"14\" height=\"14\" rx=\"2\" fill=\"" + colour + "\"/>\n";
    out += svg_text(x + 20, y + 1, label, "legend-label", "start");
    // No text measurement without a browser: estimate 7 px per character of 12 px text.
    x += 20 + 7.0 * static_cast<double>(label.size()) + 22;
  }
  return out + "</g>\n";
}

inline std::string empty_note(std::string_view id, std::string_view message) {
  return "<p id=\"" + std::string(id) + "\" class=\"empty\">" + escape_html(message) + "</p>\n";
}

// ---- phase chart ------------------------------------------------------------------------------

inline double phase_value(const report_data& r, std::size_t step, std::size_t phase) {
  const auto& row = r.phase_ms[step];
  return phase < row.size() ? drawable(row[phase]) : 0.0;
}

inline std::string step_label(const report_data& r, std::size_t i) {
  return std::to_string(i < r.steps.size() ? r.steps[i] : static_cast<std::int64_t>(i));
}

// Stacked bars: one bar per profiled step, one segment per phase, bottom-up in phase order, so
// a step that stands out (a data stall, a slow all-reduce) shows as one tall coloured segment.
inline std::string phase_chart(const report_data& r) {
  const std::size_t n_steps = r.phase_ms.size(), n_phases = r.phases.size();
  if (n_steps == 0 || n_phases == 0)
    return empty_note("phase-chart-empty", "No phase timings were recorded for this run.");

  std::vector<double> totals(n_steps, 0.0), phase_sum(n_phases, 0.0);
  for (std::size_t s = 0; s < n_steps; ++s)
    for (std::size_t p = 0; p < n_phases; ++p) {
      totals[s] += phase_value(r, s, p);
      phase_sum[p] += phase_value(r, s, p);
    }
  double grand_total = 0;
  for (double t : phase_sum) grand_total += t;

  const plot_box box{1080, 400, 70, 20, 48, 52};
  const axis_scale scale = nice_axis(*std::max_element(totals.begin(), totals.end()));
  std::string out = svg_open("phase-chart", box, "wall time per phase for each profiled step");

  // Legend entries carry each phase's mean and share, the numbers a reader wants first.
  std::vector<std::pair<std::string, std::string>> items;
  for (std::size_t p = 0; p < n_phases; ++p) {
    double mean = phase_sum[p] / static_cast<double>(n_steps);
    double share = grand_total > 0 ? 100.0 * phase_sum[p] / grand_total : 0.0;
    items.emplace_back(colour_of_phase(p),
                       r.phases[p] + " " + fixed(mean, 1) + " ms (" + fixed(share, 0) + "%)");
  }
  out += legend(items, box.x0(), 20);
  out += y_axis(box, scale, 1.0, "wall time (ms)");

  const double slot = box.plot_w() / static_cast<double>(n_steps);
  const double bar_w = std::max(1.0, slot * 0.72);
  // Label at most ~20 steps on the x axis so the numbers never run into each other.
  const std::size_t label_every = std::max<std::size_t>(1, (n_steps + 19) / 20);
  out += "<g class=\"bars\" shape-rendering=\"crispEdges\">\n";
  for (std::size_t s = 0; s < n_steps; ++s) {
    double x = box.x0() + slot * static_cast<double>(s) + (slot - bar_w) / 2;
    double y = box.y0();
    for (std::size_t p = 0; p < n_phases; ++p) {
      double v = phase_value(r, s, p);
      if (v <= 0) continue;
      double h = v / scale.top * box.plot_h();
      y -= h;
      out += "<rect class=\"bar phase-" + std::to_string(p) + "\" x=\"" + fixed(x, 1) +
             "\" y=\"" + fixed(y, 1) + "\" width=\"" + fixed(bar_w, 1) + "\" height=\"" +
             fixed(h, 1) + "\" fill=\"" + colour_of_phase(p) + "\"><title>step " +
             step_label(r, s) + ", " + escape_html(r.phases[p]) + ": " + fixed(v, 2) +
             " ms</title></rect>\n";
    }
    if (n_steps <= 24)  // room for the step's total above its bar
      out += svg_text(x + bar_w / 2, y - 5, fixed(totals[s], 1), "bar-total");
    if (s % label_every == 0)
      out += svg_text(x + bar_w / 2, box.y0() + 18, step_label(r, s), "tick");
  }
  out += "</g>\n";
  out += svg_text(box.x0() + box.plot_w() / 2, box.height - 10, "profiled step", "axis-title");
  return out + "</svg>\n";
}

// ---- memory chart -----------------------------------------------------------------------------

inline std::string phase_colour_by_name(const report_data& r, std::string_view name) {
  for (std::size_t p = 0; p < r.phases.size(); ++p)
    if (r.phases[p] == name) return colour_of_phase(p);
  return "#cccccc";
}

// Allocated bytes over time as a filled area, the peak marked with a dashed line and a dot, and
// under the axis a thin band coloured by the phase that ran at each moment: it answers "in which
// phase does memory peak?" without a second chart.
inline std::string memory_chart(const report_data& r) {
  std::vector<memory_sample> samples;
  for (const auto& m : r.memory)
    if (std::isfinite(m.time_ms)) samples.push_back(m);
  if (samples.empty())
    return empty_note("memory-chart-empty", "No memory samples were recorded for this run.");
  std::stable_sort(samples.begin(), samples.end(),
                   [](const auto& a, const auto& b) { return a.time_ms < b.time_ms; });

  const auto peak_it = std::max_element(samples.begin(), samples.end(),
                                        [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  // The profiler's peak can exceed every sample (it comes from the allocator's own counter).
  const double peak = static_cast<double>(std::max(r.peak_bytes, peak_it->bytes));
  const byte_unit unit = unit_for(peak);
  const axis_scale y_scale = nice_axis(peak / unit.scale);
  const double y_top = y_scale.top * unit.scale;

  const double t0 = samples.front().time_ms, t1 = samples.back().time_ms;
  const bool in_seconds = t1 - t0 >= 10000;  // "12.5 s" reads better than "12500 ms"
  const double t_div = in_seconds ? 1000.0 : 1.0;
  const double span = std::max(t1 - t0, 1e-9);
  const axis_scale x_scale = nice_axis(span / t_div, 8);

  const plot_box box{1080, 360, 70, 20, 48, 60};
  // x spans the samples exactly (a nice-rounded end would leave an empty strip on the right).
  auto px = [&](double t) { return box.x0() + (t - t0) / span * box.plot_w(); };
  auto py = [&](double b) { return box.y0() - std::max(0.0, b) / y_top * box.plot_h(); };

  std::string out = svg_open("memory-chart", box, "allocated memory over time");
  std::vector<std::pair<std::string, std::string>> items = {
      {std::string(memory_area_colour), "allocated"},
      {std::string(peak_colour), "peak " + bytes_text(peak)}};
  if (!r.phases.empty()) items.emplace_back("", "band under the axis, phase:");
  for (std::size_t p = 0; p < r.phases.size(); ++p)
    items.emplace_back(colour_of_phase(p), r.phases[p]);
  out += legend(items, box.x0(), 20);
  out += y_axis(box, {y_scale.step * unit.scale, y_top}, unit.scale,
                "allocated (" + std::string(unit.name) + ")");

  // x ticks
  int x_precision = tick_precision(x_scale.step);
  out += svg_line(box.x0(), box.y0(), box.x1(), box.y0(), "axis");
  for (double v = std::ceil(t0 / t_div / x_scale.step) * x_scale.step;
       v <= t1 / t_div + x_scale.step * 1e-6; v += x_scale.step) {
    double x = px(v * t_div);
    out += svg_line(x, box.y0(), x, box.y0() + 4, "axis");
    out += svg_text(x, box.y0() + 28, fixed(v, x_precision), "tick");
  }
  out += svg_text(box.x0() + box.plot_w() / 2, box.height - 10,
                  in_seconds ? "time (s)" : "time (ms)", "axis-title");

  // Area and line share one list of points; the area closes down to the baseline.
  std::string points;
  for (const auto& m : samples)
    points += fixed(px(m.time_ms), 1) + "," + fixed(py(static_cast<double>(m.bytes)), 1) + " ";
  std::string base_right = fixed(px(samples.back().time_ms), 1) + "," + fixed(box.y0(), 1);
  std::string base_left = fixed(px(samples.front().time_ms), 1) + "," + fixed(box.y0(), 1);
  out += "<polygon class=\"memory-area\" fill=\"" + std::string(memory_area_colour) +
         "\" points=\"" + base_left + " " + points + base_right + "\"/>\n";
  out += "<polyline class=\"memory-line\" fill=\"none\" stroke=\"" +
         std::string(memory_line_colour) + "\" stroke-width=\"2\" stroke-linejoin=\"round\" points=\"" +
         points + "\"/>\n";

  // Phase band just under the baseline. A sample is taken when its phase ends, so the stretch
  // from one sample to the next is the later sample's phase (forward's climb ends in forward's
  // sample); the first sample closes a phase whose start was not sampled, and the chart starts there.
  out += "<g class=\"phase-band\" shape-rendering=\"crispEdges\">\n";
  for (std::size_t i = 1; i < samples.size(); ++i) {
    double xa = px(samples[i - 1].time_ms), xb = px(samples[i].time_ms);
    out += "<rect x=\"" + fixed(xa, 1) + "\" y=\"" + fixed(box.y0() + 5, 1) + "\" width=\"" +
           fixed(std::max(0.5, xb - xa), 1) + "\" height=\"6\" fill=\"" +
           phase_colour_by_name(r, samples[i].phase) + "\"><title>" +
           escape_html(samples[i].phase) + "</title></rect>\n";
  }
  out += "</g>\n";

  // Peak: dashed line at the peak, a dot on the highest sample, a label that names its phase.
  double peak_y = py(peak);
  out += "<line class=\"peak-line\" x1=\"" + fixed(box.x0(), 1) + "\" y1=\"" + fixed(peak_y, 1) +
         "\" x2=\"" + fixed(box.x1(), 1) + "\" y2=\"" + fixed(peak_y, 1) + "\" stroke=\"" +
         std::string(peak_colour) + "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";
  double dot_x = px(peak_it->time_ms), dot_y = py(static_cast<double>(peak_it->bytes));
  out += "<circle id=\"memory-peak\" cx=\"" + fixed(dot_x, 1) + "\" cy=\"" + fixed(dot_y, 1) +
         "\" r=\"5\" fill=\"" + std::string(peak_colour) + "\" stroke=\"white\" stroke-width=\"1.5\"/>\n";
  // The dot is the highest sample; say so when the allocator's peak is higher than it.
  std::string label = "peak " + bytes_text(peak);
  std::string where = peak_it->phase.empty() ? "" : " in " + peak_it->phase;
  if (static_cast<double>(peak_it->bytes) < peak)
    label += "; highest sample " + bytes_text(static_cast<double>(peak_it->bytes)) + where;
  else
    label += where;
  // Keep the label inside the plot: right of the dot, or left of it near the right edge.
  bool left_side = dot_x > box.x0() + box.plot_w() * 0.7;
  out += svg_text(dot_x + (left_side ? -10 : 10), peak_y - 7, label, "peak-label",
                  left_side ? "end" : "start");
  return out + "</svg>\n";
}

// ---- tables -----------------------------------------------------------------------------------

inline std::string top_ops_table(const report_data& r) {
  if (r.top_ops.empty()) return empty_note("top-ops-empty", "No operator timings were recorded.");
  double self_sum = 0;
  for (const auto& op : r.top_ops) self_sum += drawable(op.self_ms);
  std::string out =
      "<table id=\"top-ops\"><thead><tr><th class=\"num\">#</th><th>operator</th>"
      "<th class=\"num\">calls</th><th class=\"num\">self ms</th><th class=\"num\">total ms</th>"
      "<th class=\"num\">self &#956;s/call</th><th>share of listed self time</th></tr></thead><tbody>\n";
  for (std::size_t i = 0; i < r.top_ops.size(); ++i) {
    const auto& op = r.top_ops[i];
    double share = self_sum > 0 ? 100.0 * drawable(op.self_ms) / self_sum : 0.0;
    double per_call_us = op.calls > 0 ? 1000.0 * op.self_ms / static_cast<double>(op.calls) : 0.0;
    out += "<tr><td class=\"num\">" + std::to_string(i + 1) + "</td><td class=\"name\">" +
           escape_html(op.name) + "</td><td class=\"num\">" + grouped(op.calls) +
           "</td><td class=\"num\">" + fixed(op.self_ms, 2) + "</td><td class=\"num\">" +
           fixed(op.total_ms, 2) + "</td><td class=\"num\">" + fixed(per_call_us, 1) +
           "</td><td><span class=\"share-bar\" style=\"width:" + fixed(share * 2.0, 1) +
           "px\"></span> " + fixed(share, 1) + "%</td></tr>\n";
  }
  return out + "</tbody></table>\n";
}

inline std::string held_bytes_table(const report_data& r) {
  if (r.held_bytes.empty()) return empty_note("held-bytes-empty", "No held-memory breakdown.");
  std::int64_t sum = 0;
  for (const auto& [_, b] : r.held_bytes) sum += b;
  auto share = [&](std::int64_t b) {
    return r.peak_bytes > 0 ? fixed(100.0 * static_cast<double>(b) / static_cast<double>(r.peak_bytes), 1) + "%"
                            : std::string("&#8211;");
  };
  std::string out =
      "<table id=\"held-bytes\"><thead><tr><th>held by</th><th class=\"num\">bytes</th>"
      "<th class=\"num\">size</th><th class=\"num\">of peak</th></tr></thead><tbody>\n";
  for (const auto& [name, b] : r.held_bytes)
    out += "<tr><td>" + escape_html(name) + "</td><td class=\"num\">" + grouped(b) +
           "</td><td class=\"num\">" + bytes_text(static_cast<double>(b)) + "</td><td class=\"num\">" +
           share(b) + "</td></tr>\n";
  out += "<tr class=\"sum\"><td>sum</td><td class=\"num\">" + grouped(sum) + "</td><td class=\"num\">" +
         bytes_text(static_cast<double>(sum)) + "</td><td class=\"num\">" + share(sum) + "</td></tr>\n";
  // What the sum does not cover (activations, workspace, fragmentation) is the rest of the peak.
  if (r.peak_bytes > sum)
    out += "<tr class=\"rest\"><td>rest of peak (activations, workspace, cache)</td><td class=\"num\">" +
           grouped(r.peak_bytes - sum) + "</td><td class=\"num\">" +
           bytes_text(static_cast<double>(r.peak_bytes - sum)) + "</td><td class=\"num\">" +
           share(r.peak_bytes - sum) + "</td></tr>\n";
  return out + "</tbody></table>\n";
}

inline std::string gradients_table(const report_data& r) {
  if (r.gradients.empty())
    return empty_note("gradients-empty", "Gradient statistics were not collected for this run.");
  std::string out =
      "<table id=\"gradients\"><thead><tr><th>module</th><th class=\"num\">grad norm</th>"
      "<th class=\"num\">update / weight</th><th>finite</th></tr></thead><tbody>\n";
  for (const auto& g : r.gradients) {
    bool ok = g.finite && std::isfinite(g.grad_norm);
    out += std::string(ok ? "<tr>" : "<tr class=\"bad\">") + "<td class=\"name\">" +
           escape_html(g.module) + "</td><td class=\"num\">" + readable(g.grad_norm) +
           "</td><td class=\"num\">" + scientific(g.update_ratio, 2) + "</td><td>" +
           (ok ? "yes" : "<strong>NO: NaN/Inf</strong>") + "</td></tr>\n";
  }
  return out + "</tbody></table>\n";
}

// ---- page -------------------------------------------------------------------------------------

// Inline only: the CSP in the page forbids loading any stylesheet or font.
inline constexpr std::string_view page_style = R"css(
body { font-family: "DejaVu Sans", "Segoe UI", Helvetica, Arial, sans-serif; color: #1d2330;
       background: #ffffff; margin: 0; padding: 24px 40px 48px; font-size: 14px; }
main { max-width: 1100px; margin: 0 auto; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #e3e6ec; padding-bottom: 4px; }
.summary { color: #555d6e; margin: 0 0 14px; }
.verdict { font-size: 19px; font-weight: bold; padding: 14px 18px; background: #fff6e0;
           border-left: 6px solid #e8a317; border-radius: 4px; margin: 8px 0 12px; }
.warnings { background: #fdecea; border-left: 6px solid #c4161c; border-radius: 4px;
            padding: 8px 18px 8px 34px; margin: 0 0 12px; }
.warnings li { margin: 4px 0; }
.empty { color: #6b7280; font-style: italic; padding: 12px; background: #f6f7f9; }
svg.chart { display: block; max-width: 100%; height: auto; }
svg text { font-family: inherit; fill: #1d2330; }
svg .tick { font-size: 11px; fill: #555d6e; }
svg .axis-title { font-size: 12px; fill: #333a48; }
svg .legend-label { font-size: 12px; }
svg .legend-caption { font-size: 12px; fill: #6b7280; }
svg .bar-total { font-size: 10px; fill: #555d6e; }
svg .peak-label { font-size: 12px; font-weight: bold; fill: #c4161c; }
svg .grid { stroke: #e6e8ee; stroke-width: 1; }
svg .axis { stroke: #8a90a0; stroke-width: 1; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #eceef2; text-align: left; }
th { background: #f3f4f7; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.name { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px;
          word-break: break-all; }
tr.bad td { background: #fdecea; color: #8b0f13; }
tr.sum td { font-weight: 600; border-top: 1px solid #c9ccd4; }
tr.rest td { color: #6b7280; }
.share-bar { display: inline-block; height: 9px; background: #8fa8c8; vertical-align: middle; }
.columns { display: flex; gap: 32px; } .columns > section { flex: 1; min-width: 0; }
)css";

// One line under the title: how many steps, mean step time, peak memory.
inline std::string summary_line(const report_data& r) {
  std::string out;
  if (!r.phase_ms.empty()) {
    double total = 0;
    for (std::size_t s = 0; s < r.phase_ms.size(); ++s)
      for (std::size_t p = 0; p < r.phases.size(); ++p) total += phase_value(r, s, p);
    out += std::to_string(r.phase_ms.size()) + " profiled steps";
    if (!r.steps.empty())
      out += " (" + std::to_string(r.steps.front()) + "&#8211;" + std::to_string(r.steps.back()) + ")";
    out += ", mean step " + fixed(total / static_cast<double>(r.phase_ms.size()), 1) + " ms";
  }
  if (r.peak_bytes > 0)
    out += std::string(out.empty() ? "" : ", ") + "peak memory " +
           bytes_text(static_cast<double>(r.peak_bytes));
  return out.empty() ? "" : "<p class=\"summary\">" + out + "</p>\n";
}

}  // namespace html_detail

// The whole report as one HTML document (UTF-8). Empty sections say so instead of drawing.
inline std::string render_html(const report_data& r) {
  using namespace html_detail;
  const std::string title = r.title.empty() ? "kiln profile" : r.title;
  std::string out;
  out.reserve(64 * 1024);
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // Belt and braces for "works offline": the browser itself refuses any fetch.
  out += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "style-src 'unsafe-inline'\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<title>" + escape_html(title) + "</title>\n<style>" + std::string(page_style) +
         "</style>\n</head>\n<body>\n<main>\n";
  out += "<h1>" + escape_html(title) + "</h1>\n" + summary_line(r);
  out += "<div id=\"verdict\" class=\"verdict\">" +
         escape_html(r.verdict.empty() ? "no verdict" : r.verdict) + "</div>\n";
  if (!r.warnings.empty()) {
    out += "<ul id=\"warnings\" class=\"warnings\">\n";
    for (const auto& w : r.warnings) out += "<li>" + escape_html(w) + "</li>\n";
    out += "</ul>\n";
  }
  out += "<section>\n<h2>Time per step, by phase</h2>\n" + phase_chart(r) + "</section>\n";
  out += "<section>\n<h2>Memory over time</h2>\n" + memory_chart(r) + "</section>\n";
  out += "<section>\n<h2>Top operators by self time</h2>\n" + top_ops_table(r) + "</section>\n";
  out += "<div class=\"columns\">\n<section>\n<h2>Memory held</h2>\n" + held_bytes_table(r) +
         "</section>\n<section>\n<h2>Gradient health</h2>\n" + gradients_table(r) +
         "</section>\n</div>\n";
  out += "</main>\n</body>\n</html>\n";
  return out;
}

// Writes the report next to `path` and renames it into place, so a browser (or a tail -f on the
// run directory) never sees half a page. Creates the parent directory if needed.
inline void write_html(const std::filesystem::path& path, const report_data& r) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  auto tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw kiln::error("cannot write profile report " + tmp.string());
    const std::string html = render_html(r);
    out.write(html.data(), static_cast<std::streamsize>(html.size()));
    out.flush();
    if (!out) throw kiln::error("cannot write profile report " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw kiln::error("cannot move profile report into place at " + path.string());
  }
}

}  // namespace kiln::profiler
