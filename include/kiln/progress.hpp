// kiln/progress.hpp: what a run shows a person and what it leaves for programs.
//
// On a terminal, one line redrawn in place (step, loss, steps/s, ETA); in a log file or a
// pipe, one plain line every log interval, because carriage returns make logs unreadable.
// Metrics go to metrics.jsonl, one JSON object per line, appended as the run goes.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "kiln/callbacks.hpp"
#include "kiln/errors.hpp"

namespace kiln {

namespace detail {

inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<std::int64_t>(seconds + 0.5);
  char text[32];
  if (s >= 3600) std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
  else std::snprintf(text, sizeof text, "%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  return text;
}

inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream out;
  out.precision(7);
  out << v;
  return out.str();
}

}  // namespace detail

// A JSON object built field by field: {"step": 10, "loss": 0.5}.
class json_line {
 public:
  json_line& add(const std::string& key, double value) { return raw(key, detail::json_number(value)); }
  json_line& add(const std::string& key, std::int64_t value) { return raw(key, std::to_string(value)); }
  json_line& add(const std::string& key, const std::string& value) {
    std::string quoted = "\"";
    for (char c : value) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    return raw(key, quoted + "\"");
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  json_line& raw(const std::string& key, const std::string& value) {
    body_ += (body_.empty() ? "\"" : ", \"") + key + "\": " + value;
    return *this;
  }
  std::string body_;
};

// Appends metric lines to <run dir>/metrics.jsonl; flushed per line so a killed run keeps them.
class metrics_log {
 public:
  metrics_log() = default;
  explicit metrics_log(const std::filesystem::path& file) : out_(file, std::ios::app) {
    if (!out_) throw error("cannot open " + file.string() + " for appending");
  }
  void write(const json_line& line) {
    if (!out_.is_open()) return;
    out_ << line.str() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// The progress display. `live` shows step lines (redrawn on a terminal: is stderr a tty?);
// `results` shows lines that must stay, such as evaluations (off on ranks other than 0).
class progress_display {
 public:
  explicit progress_display(bool live = true, bool results = true)
      : enabled_(live), results_(results), interactive_(::isatty(2) == 1) {}

  bool interactive() const { return interactive_; }

  void begin(std::int64_t start_step, std::int64_t total_steps) {
    start_step_ = start_step;
    total_ = total_steps;
    start_ = last_draw_ = std::chrono::steady_clock::now();
  }

  double steps_per_second(std::int64_t step) const {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return elapsed > 0 ? static_cast<double>(step - start_step_) / elapsed : 0.0;
  }

  // Called every step; draws at most 10 times a second on a terminal, every `log` step otherwise.
  void update(std::int64_t step, double loss, double lr, bool log_step) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (interactive_) {
      if (step != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      std::fprintf(stderr, "\r\033[K%s", line(step, loss, lr, true).c_str());
      std::fflush(stderr);
      drawn_ = true;
    } else if (log_step) {
      std::fprintf(stderr, "%s\n", line(step, loss, lr, false).c_str());
    }
  }

  // A line that must stay (evaluation results, warnings): clears the live line first.
  void print(const std::string& text) {
    if (!results_) return;
    if (interactive_ && drawn_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
    drawn_ = false;  // the live line was replaced; the next update draws it again
  }

  void end() {
    if (enabled_ && interactive_ && drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  std::string line(std::int64_t step, double loss, double lr, bool bar) const {
    const double rate = steps_per_second(step);
    const double eta = rate > 0 ? static_cast<double>(total_ - step) / rate : NAN;
    const double fraction = total_ > 0 ? static_cast<double>(step) / static_cast<double>(total_) : 0.0;
    char text[256];
    std::string meter;
    if (bar) {
      const int width = 20, filled = static_cast<int>(fraction * width);
      meter = " [" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
    }
    std::snprintf(text, sizeof text, "step %lld/%lld%s %3.0f%% | loss %.4f | lr %.2e | %.1f steps/s | ETA %s",
                  (long long)step, (long long)total_, meter.c_str(), 100.0 * fraction, loss, lr, rate,
                  detail::format_duration(eta).c_str());
    return text;
  }

  bool enabled_;
  bool results_;
  bool interactive_;
  bool drawn_ = false;
  std::int64_t start_step_ = 0;
  std::int64_t total_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// The progress display as the trainer's first callback: the live step line, evaluation lines,
// and the printer other callbacks write through.
class progress_callback : public callback {
 public:
  progress_callback(bool live, bool results) : display_(live, results) {}

  line_printer printer() {
    return line_printer{[this](const std::string& text) { display_.print(text); }};
  }
  double steps_per_second(std::int64_t step) const { return display_.steps_per_second(step); }

  void on_fit_begin(std::int64_t start_step, std::int64_t total_steps) override {
    display_.begin(start_step, total_steps);
  }
  control on_step_end(const step_info& s) override {
    display_.update(s.step, s.loss, s.lr, s.log_step);
    return control::proceed;
  }
  control on_eval(const eval_info& e) override {
    char loss[64];
    std::snprintf(loss, sizeof loss, "eval @ step %lld: loss %.4f", (long long)e.step, e.loss);
    display_.print(std::string(loss) + e.metrics_text() + " (" + std::to_string(e.samples) + " items)");
    return control::proceed;
  }
  void on_fit_end(const fit_summary&) override { display_.end(); }

 private:
  progress_display display_;
};

// metrics.jsonl as a callback: on each log step (every [train] log_every steps, and the last) a
// line with the mean loss since the previous one, and a line per evaluation.
class metrics_callback : public callback {
 public:
  explicit metrics_callback(metrics_log log) : log_(std::move(log)) {}

  control on_step_end(const step_info& s) override {
    loss_sum_ += s.loss;
    ++steps_;
    if (!s.log_step) return control::proceed;
    json_line line;
    line.add("step", s.step).add("epoch", s.epoch).add("loss", loss_sum_ / static_cast<double>(steps_)).add("lr", s.lr);
    if (s.grad_norm >= 0) line.add("grad_norm", s.grad_norm);
    line.add("steps_per_s", s.steps_per_second);
    log_.write(line);
    loss_sum_ = 0.0;
    steps_ = 0;
    return control::proceed;
  }
  control on_eval(const eval_info& e) override {
    json_line line;
    line.add("step", e.step).add("eval_loss", e.loss);
    for (const auto& m : e.metrics) line.add("eval_" + m.name, m.value);
    log_.write(line);
    return control::proceed;
  }

 private:
  metrics_log log_;
  double loss_sum_ = 0.0;  // step losses since the last line
  std::int64_t steps_ = 0;
};

}  // namespace kiln
