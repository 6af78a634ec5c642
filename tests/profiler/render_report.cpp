// Writes a sample profile report to argv[1] for the headless-browser render test
// (tests/profiler/html_render_test.sh). The numbers imitate a small GPT run on one GPU: ten
// profiled steps with one data stall, memory that climbs through forward and falls through
// backward, fifteen operators and four modules. Deterministic, so screenshots are comparable.
#include <cmath>
#include <cstdint>
#include <exception>
#include <iostream>

#include "kiln/profiler/report_html.hpp"

namespace {

// A tiny deterministic generator: the same page every run, no <random> distribution differences
// between standard libraries.
struct jitter {
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  double next() {  // in [-1, 1)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / static_cast<double>(1ull << 52) - 1.0;
  }
};

kiln::profiler::report_data sample_report() {
  using namespace kiln::profiler;
  constexpr std::int64_t mib = 1024 * 1024;
  jitter noise;
  report_data r;
  r.title = "kiln profile: profiling (gpt) <sample & \"escaped\">";
  r.phases = {"data", "forward", "backward", "optimizer", "communication"};
  const double typical[] = {3.1, 38.4, 71.9, 8.7, 6.2};
  for (std::int64_t step = 100; step < 110; ++step) {
    r.steps.push_back(step);
    std::vector<double> row;
    for (double t : typical) row.push_back(t * (1.0 + 0.05 * noise.next()));
    if (step == 104) row[0] = 25.3;  // the loader fell behind once
    r.phase_ms.push_back(row);
  }
  r.verdict = "compute-bound: forward+backward take 81% of the step";
  r.warnings = {"step 104: the data phase took 25.3 ms, 8x its median: the loader fell behind",
                "optimizer state is fp32 for bf16 weights: <3x> the parameter memory"};

  r.top_ops = {
      {"aten::mm", 4320, 612.4, 598.1},
      {"aten::_scaled_dot_product_flash_attention_backward", 120, 201.7, 199.8},
      {"aten::addmm", 1440, 188.2, 180.5},
      {"aten::_scaled_dot_product_flash_attention", 120, 96.3, 95.1},
      {"aten::gelu_backward", 120, 41.2, 41.2},
      {"aten::native_layer_norm_backward", 250, 38.6, 37.9},
      {"aten::_foreach_addcdiv_", 10, 36.0, 36.0},
      {"aten::gelu", 120, 22.4, 22.4},
      {"aten::native_layer_norm", 250, 21.9, 21.3},
      {"aten::add", 2890, 19.7, 19.7},
      {"aten::_foreach_mul_", 20, 17.3, 17.3},
      {"aten::embedding_dense_backward", 10, 12.8, 11.9},
      {"aten::_log_softmax_backward_data", 10, 9.4, 9.4},
      {"aten::copy_", 1310, 8.8, 8.8},
      {"custom::fused<float, \"rope\">", 240, 6.1, 6.1},
  };

  // Memory: the persistent state, plus activations that grow through forward, peak when
  // backward starts and are freed as backward proceeds. 20 samples per step.
  const std::int64_t params = 475 * mib, grads = 475 * mib, optimizer_state = 950 * mib;
  const std::int64_t base = params + grads + optimizer_state, activations = 5200 * mib;
  double t = 0;
  for (std::size_t s = 0; s < r.phase_ms.size(); ++s) {
    const auto& row = r.phase_ms[s];
    for (int i = 0; i < 20; ++i) {
      std::size_t phase = i < 2 ? 0 : i < 8 ? 1 : i < 16 ? 2 : i < 18 ? 3 : 4;
      double within = 0;  // fraction of activations alive
      if (phase == 1) within = (i - 1) / 6.0;
      if (phase == 2) within = 1.0 - (i - 8) / 8.0;
      double extra = phase == 3 ? 180.0 * mib : 40.0 * mib * (1.0 + noise.next());
      r.memory.push_back({t, base + static_cast<std::int64_t>(within * activations + extra),
                          r.phases[phase]});
      t += row[phase] / (phase == 0 || phase == 3 || phase == 4 ? 2.0 : phase == 1 ? 6.0 : 8.0);
    }
  }
  r.peak_bytes = base + activations + 312 * mib;  // the allocator saw a higher peak than sampled
  r.held_bytes = {{"parameters", params}, {"gradients", grads}, {"optimizer state", optimizer_state}};

  r.gradients = {{"embed", 0.412, 8.1e-4, true},
                 {"blocks.0.attn", 1.376, 1.2e-3, true},
                 {"blocks.11.mlp", 2.094, 9.6e-4, true},
                 {"lm_head", 0.883, 4.4e-4, true}};
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: render_report OUT.html\n";
    return 2;
  }
  try {
    kiln::profiler::write_html(argv[1], sample_report());
  } catch (const std::exception& e) {
    std::cerr << "render_report: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
