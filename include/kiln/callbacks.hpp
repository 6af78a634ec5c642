// kiln/callbacks.hpp: hooks into kiln::trainer's loop (Lightning's callbacks, the HF
// Trainer's TrainerCallback). Returning control::stop from a hook ends the run after the
// current step, with a final save, like a KeyboardInterrupt handled well.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

enum class control { proceed, stop };

// What a callback prints with: `info.print("...")` puts a line that stays through the trainer's
// progress display, which clears its live step line first (a plain printf would land in the
// middle of it), and only on the rank that shows results. Outside fit(), to stderr.
struct line_printer {
  std::function<void(const std::string&)> sink;
  void operator()(const std::string& text) const {
    if (sink) sink(text);
    else std::fprintf(stderr, "%s\n", text.c_str());
  }
};

struct step_info {
  std::int64_t step = 0;  // optimizer steps completed
  std::int64_t total_steps = 0;
  std::int64_t epoch = 0;
  double loss = 0.0;  // mean loss over the micro-batches of this step
  double lr = 0.0;
  double grad_norm = -1.0;  // -1 when not measured (no clipping)
  bool skipped = false;     // non-finite gradients: no update
  double steps_per_second = 0.0;
  bool log_step = false;  // a step the run records: every [train] log_every steps, and the last
  line_printer print;
};

// A number an evaluation reports besides the loss (the loss kind's metrics, kiln/loss.hpp).
struct metric_value {
  std::string name;
  double value = 0.0;
  bool percent = false;  // a fraction shown as a percentage
};

struct eval_info {
  std::int64_t step = 0;
  double loss = 0.0;           // mean over the loss's items (scored targets, target values, ...)
  double accuracy = 0.0;       // fraction in [0, 1], where the loss reports accuracy
  std::int64_t samples = 0;    // the items the means are over
  std::vector<metric_value> metrics;  // accuracy, perplexity, mae, ... as the loss kind defines them
  line_printer print;  // set for the evaluations fit() hands to callbacks

  // ", accuracy 91.20%, perplexity 3.1" for an evaluation line.
  std::string metrics_text() const {
    std::string text;
    for (const auto& m : metrics) {
      char value[64];
      if (m.percent) std::snprintf(value, sizeof value, "%.2f%%", 100.0 * m.value);
      else std::snprintf(value, sizeof value, "%.4g", m.value);
      text += ", " + m.name + " " + value;
    }
    return text;
  }
};

struct fit_summary {
  std::int64_t steps = 0;
  bool stopped_early = false;
  double seconds = 0.0;
  double final_train_loss = 0.0;
  eval_info final_eval;
  bool evaluated = false;
  int threads = 0;                // at the end (0: the trainer left them alone)
  std::int64_t thread_changes = 0;  // times a busy or freed machine changed them
};

class callback {
 public:
  virtual ~callback() = default;
  virtual void on_fit_begin(std::int64_t /*start_step*/, std::int64_t /*total_steps*/) {}
  virtual control on_step_end(const step_info&) { return control::proceed; }
  virtual control on_eval(const eval_info&) { return control::proceed; }
  virtual void on_fit_end(const fit_summary&) {}
};

// A callback from a lambda, for the common one-hook case:
//   trainer.add_callback(kiln::on_step_end([](const kiln::step_info& s) { ... }));
inline std::shared_ptr<callback> on_step_end(std::function<control(const step_info&)> f) {
  struct lambda_callback : callback {
    std::function<control(const step_info&)> f;
    control on_step_end(const step_info& s) override { return f(s); }
  };
  auto c = std::make_shared<lambda_callback>();
  c->f = std::move(f);
  return c;
}

inline std::shared_ptr<callback> on_eval(std::function<control(const eval_info&)> f) {
  struct lambda_callback : callback {
    std::function<control(const eval_info&)> f;
    control on_eval(const eval_info& e) override { return f(e); }
  };
  auto c = std::make_shared<lambda_callback>();
  c->f = std::move(f);
  return c;
}

}  // namespace kiln
