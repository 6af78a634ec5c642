// kiln_bench_step: the quickstart model's training step in kiln's trainer against the same
// loop written by hand in LibTorch (with LibTorch's AdamW and loss, and with kiln's fused AdamW
// and loss called directly), plus the machine's bounds for that step.
//
//   kiln_bench_step --threads N --steps S --rounds R   (bench/run drives it; see README.md, Benchmarks)
//
// All loops train the same MLP (784-256-256-10, dropout 0.1) on Fashion-MNIST batches of 128
// with AdamW, same threads, same data order. Rounds rotate the order of the three loops so that
// machine noise hits all alike; each round times S steps after a warmup. Reported: medians
// over rounds, the median of per-round ratios, and the ratio of the best rounds (the run
// least disturbed by neighbours on a shared machine), then each profiler's cost as the median
// ratio of kiln with it to kiln with profiler::none. Output: one JSON object on stdout.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using kiln_bench::median;

using clock_type = std::chrono::steady_clock;

kiln::models::mlp_settings model_settings() {
  return {.in_features = 784, .hidden = {256, 256}, .classes = 10, .dropout = 0.1};
}

// kiln: the trainer owns the loop. Returns seconds per step. A profiler other than none is
// active on every step (no wait, no warmup) and prints nothing.
template <class Profiler = kiln::profiler::none>
double time_kiln(const kiln::data::tensor_pair& train, std::int64_t steps, std::uint64_t seed) {
  using trainer_t = kiln::trainer<kiln::optim::adamw, Profiler>;
  torch::manual_seed(seed);
  kiln::models::mlp model(model_settings());
  kiln::data::batch_loader loader(train, {.batch_size = 128, .seed = seed});
  typename trainer_t::settings s;
  s.accelerator.optimizer = {.lr = 1e-3, .weight_decay = 0.01};
  if constexpr (Profiler::enabled)
    s.accelerator.profiler = {.wait = 0, .warmup = 0, .active = 1 << 30, .repeat = 1, .print = false};
  s.options.steps = steps;
  s.options.log_every = 1000000;
  s.options.progress = false;
  trainer_t trainer(s);
  const auto start = clock_type::now();
  trainer.fit(model, loader);
  return std::chrono::duration<double>(clock_type::now() - start).count() / static_cast<double>(steps);
}

// The same job as a LibTorch user writes it by hand: with LibTorch's AdamW (what kiln replaces),
// or with kiln's fused AdamW called directly (the same optimizer as the trainer's, so that the
// ratio to kiln is the cost of the trainer alone).
enum class hand_optimizer { libtorch, kiln_fused };

struct kiln_adamw_by_hand {
  kiln::optim::adamw optimizer{{.lr = 1e-3, .weight_decay = 0.01}};
  explicit kiln_adamw_by_hand(torch::nn::Module& model) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (auto& item : model.named_parameters()) named.emplace_back(item.key(), item.value());
    optimizer.attach(named);
  }
  void zero_grad() { optimizer.zero_grad(); }
  void step() { optimizer.step(); }
};

template <hand_optimizer Optimizer>
double time_handwritten(const kiln::data::tensor_pair& train, std::int64_t steps, std::uint64_t seed) {
  torch::manual_seed(seed);
  kiln::models::mlp model(model_settings());
  auto optimizer = [&] {
    if constexpr (Optimizer == hand_optimizer::libtorch)
      return torch::optim::AdamW(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    else
      return kiln_adamw_by_hand(*model);
  }();
  const auto n = train.inputs.size(0), batch = std::int64_t{128};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto order = torch::randperm(n, gen, torch::kInt64);
  std::int64_t position = 0;
  double loss_sum = 0;
  model->train();
  const auto start = clock_type::now();
  for (std::int64_t step = 0; step < steps; ++step) {
    if (position + batch > n) order = torch::randperm(n, gen, torch::kInt64), position = 0;
    auto idx = order.slice(0, position, position + batch);
    position += batch;
    auto x = train.inputs.index_select(0, idx), y = train.targets.index_select(0, idx);
    optimizer.zero_grad();
    // The LibTorch loop uses LibTorch's loss, as a LibTorch user writes it; the kiln-AdamW loop
    // uses kiln's, as the trainer does, so that kiln / it is the trainer's own cost alone.
    auto loss = Optimizer == hand_optimizer::libtorch ? torch::nn::functional::cross_entropy(model->forward(x), y)
                                                      : kiln::models::cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer.step();
    loss_sum += loss.item<double>();  // every real loop looks at its loss
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  if (!std::isfinite(loss_sum)) std::fprintf(stderr, "hand-written loop diverged\n");
  return seconds / static_cast<double>(steps);
}

// The step's bounds on this machine: its FLOPs at the measured GEMM rate of the step's own
// matrix shapes, and the optimizer's bytes at the measured memory bandwidth.
struct bounds {
  double gemm_gflops, bandwidth_gbs, step_gflop, optimizer_mb, compute_ms, memory_ms;
};

bounds measure_bounds(std::int64_t parameters) {
  const std::int64_t b = 128;
  const std::vector<std::pair<std::int64_t, std::int64_t>> layers = {{784, 256}, {256, 256}, {256, 10}};
  double flop = 0;
  for (auto [in, out] : layers) flop += 3.0 * 2.0 * b * in * out;  // forward + two backward GEMMs
  // GEMM rate on exactly these shapes (forward products), best of several repetitions.
  std::vector<torch::Tensor> xs, ws;
  for (auto [in, out] : layers) xs.push_back(torch::randn({b, in})), ws.push_back(torch::randn({out, in}));
  double best = 1e30;
  for (int rep = 0; rep < 30; ++rep) {
    const auto start = clock_type::now();
    for (int i = 0; i < 20; ++i)
      for (std::size_t l = 0; l < layers.size(); ++l) torch::mm(xs[l], ws[l].t());
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - start).count() / 20);
  }
  double fwd_flop = 0;
  for (auto [in, out] : layers) fwd_flop += 2.0 * b * in * out;
  const double gemm_rate = fwd_flop / best;
  // Bandwidth: a 64 MB copy reads and writes every byte.
  auto src = torch::randn({16 << 20}), dst = torch::empty_like(src);
  double best_copy = 1e30;
  for (int rep = 0; rep < 10; ++rep) {
    const auto start = clock_type::now();
    dst.copy_(src);
    best_copy = std::min(best_copy, std::chrono::duration<double>(clock_type::now() - start).count());
  }
  const double bandwidth = 2.0 * src.numel() * 4 / best_copy;
  const double optimizer_bytes = 28.0 * parameters;  // fused AdamW: p, g, m, v read; p, m, v written
  return {gemm_rate / 1e9, bandwidth / 1e9, flop / 1e9, optimizer_bytes / 1e6, 1e3 * flop / gemm_rate,
          1e3 * optimizer_bytes / bandwidth};
}

}  // namespace

int main(int argc, char** argv) {
  const kiln_bench::flags flags(argc, argv, {"--threads", "--steps", "--rounds", "--data"});
  const std::int64_t threads = flags.integer("--threads", 1), steps = flags.integer("--steps", 100),
                     rounds = flags.integer("--rounds", 21);
  const std::string data_dir = flags.text("--data", "/usr/share/datasets/fashion-mnist");
  at::set_num_threads(static_cast<int>(threads));
  auto train = kiln::data::load_fashion_mnist(data_dir, kiln::data::split::train);

  // Warm every path (allocator, OpenBLAS buffers) before timing.
  time_kiln(train, 50, 1);
  time_handwritten<hand_optimizer::libtorch>(train, 50, 1);
  time_handwritten<hand_optimizer::kiln_fused>(train, 50, 1);
  std::vector<double> kiln_s, hand_s, fused_s, ratio, overhead_ratio;
  for (std::int64_t r = 0; r < rounds; ++r) {
    // rotate the order so that no side always runs on a warmer machine
    double k = 0, h = 0, f = 0;
    for (int turn = 0; turn < 3; ++turn) {
      switch ((r + turn) % 3) {
        case 0: k = time_kiln(train, steps, 100 + r); break;
        case 1: h = time_handwritten<hand_optimizer::libtorch>(train, steps, 100 + r); break;
        default: f = time_handwritten<hand_optimizer::kiln_fused>(train, steps, 100 + r); break;
      }
    }
    kiln_s.push_back(k), hand_s.push_back(h), fused_s.push_back(f), ratio.push_back(k / h), overhead_ratio.push_back(k / f);
    std::fprintf(stderr, "round %lld: kiln %.3f ms, hand-written %.3f ms (LibTorch AdamW), %.3f ms (kiln AdamW)\n",
                 (long long)r, 1e3 * k, 1e3 * h, 1e3 * f);
  }
  // Each profiler's cost: paired rounds of kiln with it against kiln with profiler::none.
  auto overhead = [&](auto profiled) {
    std::vector<double> ratios;
    for (std::int64_t r = 0; r < std::max<std::int64_t>(5, rounds / 3); ++r) {
      const double with = profiled(train, steps, 200 + r), without = time_kiln(train, steps, 200 + r);
      ratios.push_back(with / without);
    }
    return median(ratios);
  };
  const double ops = overhead(time_kiln<kiln::profiler::ops>);
  const double trace = overhead(time_kiln<kiln::profiler::trace>);
  const double memory = overhead(time_kiln<kiln::profiler::memory>);
  const double phases = overhead(time_kiln<kiln::profiler::phases>);

  std::int64_t parameters = 0;
  for (const auto& p : kiln::models::mlp(model_settings())->parameters()) parameters += p.numel();
  auto b = measure_bounds(parameters);
  std::printf(
      "{\"threads\": %lld, \"steps\": %lld, \"rounds\": %lld, \"parameters\": %lld, "
      "\"kiln_ms\": %.4f, \"handwritten_ms\": %.4f, \"paired_ratio_median\": %.4f, \"best_ratio\": %.4f, "
      "\"handwritten_fused_ms\": %.4f, \"trainer_ratio_median\": %.4f, \"trainer_best_ratio\": %.4f, "
      "\"gemm_gflops\": %.2f, \"bandwidth_gbs\": %.2f, \"step_gflop\": %.4f, \"optimizer_mb\": %.3f, "
      "\"bound_compute_ms\": %.4f, \"bound_memory_ms\": %.4f, "
      "\"profiler_overhead\": {\"ops\": %.4f, \"trace\": %.4f, \"memory\": %.4f, \"phases\": %.4f}}\n",
      (long long)threads, (long long)steps, (long long)rounds, (long long)parameters, 1e3 * median(kiln_s),
      1e3 * median(hand_s), median(ratio), *std::min_element(kiln_s.begin(), kiln_s.end()) /
          *std::min_element(hand_s.begin(), hand_s.end()), 1e3 * median(fused_s), median(overhead_ratio),
      *std::min_element(kiln_s.begin(), kiln_s.end()) / *std::min_element(fused_s.begin(), fused_s.end()), b.gemm_gflops, b.bandwidth_gbs, b.step_gflop, b.optimizer_mb,
      b.compute_ms, b.memory_ms, ops, trace, memory, phases);
  return 0;
}
