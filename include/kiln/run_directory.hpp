// kiln/run_directory.hpp: the directory of one training run, and every file written there.
//
//   recipe.toml       the resolved recipe, every value included
//   fingerprint.txt   the part of it a resumed run must share (model, data, policies)
//   metrics.jsonl     a line per logged step and per evaluation, flushed as written
//   gradients.jsonl   per-module gradient health, when diagnostics are on
//   state.pt          what a resumed run needs: the trainer puts model, optimizer, data position
//                     and RNG in it (kiln/io/state.hpp), this class only reads and writes it
//   summary.json      the final figures, written once the run finished (a finished run is never
//                     resumed)
//   profile/          the profiler's report
//
// Only rank 0 opens and writes a run directory. Files are replaced through a temporary file,
// so a killed run leaves the previous version, never half of a new one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/diagnostics.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"
#include "kiln/progress.hpp"

namespace kiln {

namespace detail {

// Moves an unfinished-or-finished older run out of the way instead of overwriting it.
inline std::filesystem::path keep_previous_run(const std::filesystem::path& dir) {
  for (int i = 1;; ++i) {
    auto kept = dir;
    kept += '.';
    kept += std::to_string(i);
    if (!std::filesystem::exists(kept)) {
      std::filesystem::rename(dir, kept);
      return kept;
    }
  }
}

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void write_text(const std::filesystem::path& file, const std::string& text) {
  auto tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) throw error("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, file);
}

inline std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  while (true) {
    bool ga = static_cast<bool>(std::getline(sa, la)), gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga && !gb) return {};
    if (!ga || !gb || la != lb) return "saved: \"" + (ga ? la : "") + "\", now: \"" + (gb ? lb : "") + "\"";
  }
}

}  // namespace detail

class run_directory {
 public:
  run_directory() = default;  // no directory: nothing is written and nothing resumed
  run_directory(std::filesystem::path dir, std::string recipe_text, std::string fingerprint)
      : dir_(std::move(dir)), recipe_text_(std::move(recipe_text)), fingerprint_(std::move(fingerprint)) {}

  bool empty() const { return dir_.empty(); }
  const std::filesystem::path& path() const { return dir_; }

  // Before training, on rank 0. True when the directory holds an unfinished run of the same
  // recipe with a saved state, and `resume` allows continuing it. Otherwise a previous run is
  // moved aside (dir.1, dir.2, ...) and the directory starts afresh with recipe.toml and
  // fingerprint.txt. An unfinished run of another recipe is refused, naming the first difference.
  bool open(bool resume) const {
    namespace fs = std::filesystem;
    if (fs::exists(dir_)) {
      const bool finished = fs::exists(dir_ / "summary.json");
      if (resume && has_state() && !finished) {
        const auto saved = fs::exists(dir_ / "fingerprint.txt") ? detail::read_text(dir_ / "fingerprint.txt") : "";
        if (saved != fingerprint_)
          throw config_error("cannot resume " + dir_.string() + ": it holds a run of a different recipe (" +
                             detail::first_difference(saved, fingerprint_) +
                             "); set [run] resume = \"never\" to start afresh (the old run is kept) or choose "
                             "another [run] dir");
        return true;
      }
      if (!fs::is_empty(dir_)) {
        auto kept = detail::keep_previous_run(dir_);
        std::fprintf(stderr, "kiln: the previous run in %s was moved to %s\n", dir_.c_str(), kept.c_str());
      }
    }
    fs::create_directories(dir_);
    detail::write_text(dir_ / "recipe.toml", recipe_text_);
    detail::write_text(dir_ / "fingerprint.txt", fingerprint_);
    return false;
  }

  bool has_state() const { return !empty() && std::filesystem::exists(state_file()); }
  state_dict load_state() const { return load_state_file(state_file()); }
  void save_state(const state_dict& state) const { save_state_file(state_file(), state); }

  // Resuming at `step`: the metrics a killed run logged after its last save are dropped, so
  // metrics.jsonl reads as one uninterrupted run.
  void resume_metrics_at(std::int64_t step) const {
    const auto file = dir_ / "metrics.jsonl";
    if (!std::filesystem::exists(file)) return;
    std::istringstream lines(detail::read_text(file));
    std::string kept;
    for (std::string line; std::getline(lines, line);) {
      const auto at = line.find("\"step\": ");
      if (at == std::string::npos || std::stoll(line.substr(at + 8)) <= step) kept += line + '\n';
    }
    detail::write_text(file, kept);
  }
  metrics_log metrics() const { return empty() ? metrics_log() : metrics_log(dir_ / "metrics.jsonl"); }

  void append_gradients(std::int64_t step, const std::vector<layer_health>& report) const {
    if (empty()) return;
    std::ofstream out(dir_ / "gradients.jsonl", std::ios::app);
    for (const auto& h : report)
      out << json_line()
                 .add("step", step)
                 .add("module", h.module)
                 .add("grad_norm", h.grad_norm)
                 .add("param_norm", h.param_norm)
                 .add("update_ratio", h.update_ratio)
                 .str()
          << '\n';
  }

  void write_summary(const json_line& summary) const { detail::write_text(dir_ / "summary.json", summary.str() + "\n"); }
  std::filesystem::path profile_dir() const { return empty() ? dir_ : dir_ / "profile"; }

 private:
  std::filesystem::path state_file() const { return dir_ / "state.pt"; }

  std::filesystem::path dir_;
  std::string recipe_text_, fingerprint_;
};

}  // namespace kiln
