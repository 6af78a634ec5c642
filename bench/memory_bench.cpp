// kiln_bench_memory: activation checkpointing and gradient accumulation on a 12-block GPT.
//
//   kiln_bench_memory --threads N --steps S --rounds R   (bench/run_memory drives it)
//
// Checkpointing: none / blocks / every-2nd, each the peak memory LibTorch allocates during one
// training step above what the step started with (kiln::memory_meter, after a first step so that
// gradients and optimizer state exist), the median step time over R rounds of S steps, and the
// median over rounds of the step-time ratio to `none` (the cases take turns within each round).
// The estimate column is 1 + (recomputed share) x (forward time / step time) of `none`: what
// recomputing costs if it adds exactly a forward pass and changes nothing else. Accumulation: N = 1, 2, 4 micro-batches
// of 16 sequences per optimizer step, same measures: memory should stay flat in N and time grow
// linearly (ratio N). Output: one JSON object per line.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using kiln_bench::median;

kiln::models::gpt_settings model_settings() {
  return {.vocab_size = 64, .seq_len = 64, .d_model = 128, .n_layer = 12, .n_head = 4, .mlp_ratio = 4, .dropout = 0.1};
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// One configuration: its optimizer step, a forward-only pass (the recompute's cost), its peak.
struct bench_case {
  std::string name;
  std::int64_t micro_steps = 1, micro_batch = 0;
  std::int64_t peak_bytes = 0;
  std::function<void()> step;
  std::function<void()> forward;
  std::vector<double> step_ms, forward_ms;
};

template <class Checkpointing>
bench_case make_case(std::string name, const kiln::data::tensor_pair& data, std::int64_t micro_steps,
                     std::int64_t batch, typename Checkpointing::settings settings) {
  struct state {
    kiln::models::gpt model;
    kiln::accelerator<kiln::optim::adamw, Checkpointing> acc;
    kiln::data::batch_loader loader;
  };
  torch::manual_seed(0);
  auto s = std::make_shared<state>(state{kiln::models::gpt(model_settings()),
                                         decltype(state::acc)({.accumulation = {.steps = micro_steps},
                                                               .checkpointing = settings,
                                                               .optimizer = {.lr = 3e-4}}),
                                         kiln::data::batch_loader(data, {.batch_size = batch})});
  s->acc.prepare(s->model);
  auto loss_of = [s](const kiln::data::batch& b) {
    auto cast = s->acc.autocast();
    return kiln::detail::classification_loss(s->model->forward(b.inputs), b.targets);
  };
  bench_case c{.name = std::move(name), .micro_steps = micro_steps, .micro_batch = batch};
  c.step = [s, loss_of, micro_steps] {
    for (std::int64_t m = 0; m < micro_steps; ++m) {
      s->acc.backward(loss_of(s->loader.next()));
      s->acc.step();
    }
  };
  c.forward = [s, loss_of] { (void)loss_of(s->loader.next()); };  // graph built, then freed
  c.step();  // gradients and optimizer state exist from here on, as in training
  kiln::memory_meter meter;
  meter.start();
  c.step();
  c.peak_bytes = meter.peak();
  meter.stop();
  return c;
}

// Rounds interleave the cases, so each round's ratios compare runs made under the same load.
void time_paired(std::vector<bench_case>& cases, std::int64_t steps, std::int64_t rounds) {
  for (std::int64_t r = 0; r < rounds; ++r)
    for (auto& c : cases) {
      auto start = std::chrono::steady_clock::now();
      for (std::int64_t s = 0; s < steps; ++s) c.step();
      c.step_ms.push_back(milliseconds_since(start) / static_cast<double>(steps));
      start = std::chrono::steady_clock::now();
      for (std::int64_t s = 0; s < steps; ++s) c.forward();
      c.forward_ms.push_back(milliseconds_since(start) / static_cast<double>(steps));
    }
}

// Median over rounds of (case / first case of the group).
double paired_ratio(const bench_case& c, const bench_case& base) {
  std::vector<double> ratios;
  for (std::size_t r = 0; r < c.step_ms.size(); ++r) ratios.push_back(c.step_ms[r] / base.step_ms[r]);
  return median(ratios);
}

// Recomputing a share of the forward adds that share of a forward pass, if nothing else changes
// (a smaller activation footprint can save time too): the estimate, from the same rounds.
double recompute_estimate(const bench_case& base, double recomputed_share) {
  std::vector<double> estimates;
  for (std::size_t r = 0; r < base.step_ms.size(); ++r)
    estimates.push_back(1.0 + recomputed_share * base.forward_ms[r] / base.step_ms[r]);
  return median(estimates);
}

void print(const char* group, const bench_case& c, const bench_case& base, double expected) {
  std::printf(
      "{\"group\": \"%s\", \"case\": \"%s\", \"micro_steps\": %lld, \"micro_batch\": %lld, \"peak_step_bytes\": %lld, "
      "\"step_ms\": %.3f, \"forward_ms\": %.3f, \"ratio\": %.4f, \"expected\": %.4f}\n",
      group, c.name.c_str(), (long long)c.micro_steps, (long long)c.micro_batch, (long long)c.peak_bytes,
      median(c.step_ms), median(c.forward_ms), paired_ratio(c, base), expected);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const kiln_bench::flags flags(argc, argv, {"--threads", "--steps", "--rounds"});
  const std::int64_t threads = flags.integer("--threads", 2), steps = flags.integer("--steps", 5),
                     rounds = flags.integer("--rounds", 5);
  at::set_num_threads(static_cast<int>(threads));
  auto data = kiln::data::make_token_sequences(2048, 64, 64, 0);
  using namespace kiln::checkpointing;

  std::vector<bench_case> checkpointing;
  checkpointing.push_back(make_case<none>("none", data, 1, 32, {}));
  checkpointing.push_back(make_case<blocks>("blocks", data, 1, 32, {}));
  checkpointing.push_back(make_case<every_nth>("every-2nd", data, 1, 32, {.every = 2}));
  time_paired(checkpointing, steps, rounds);
  const double recomputed[] = {0.0, 1.0, 0.5};
  for (std::size_t i = 0; i < checkpointing.size(); ++i)
    print("checkpointing", checkpointing[i], checkpointing[0], recompute_estimate(checkpointing[0], recomputed[i]));
  checkpointing.clear();

  std::vector<bench_case> accumulation;
  for (std::int64_t n : {1, 2, 4}) accumulation.push_back(make_case<none>("N=" + std::to_string(n), data, n, 16, {}));
  time_paired(accumulation, steps, rounds);
  // N micro-steps cost N times one: time linear in N, the expected ratio is N.
  for (auto& c : accumulation) print("accumulation", c, accumulation[0], static_cast<double>(c.micro_steps));
  return 0;
}
