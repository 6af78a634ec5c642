// kiln_bench_memory: activation checkpointing and gradient accumulation on a 12-block GPT.
//
//   kiln_bench_memory --threads N --steps S --rounds R   (bench/run_memory drives it)
//
// Checkpointing: none / blocks / every-2nd, each the peak memory LibTorch allocates during one
// training step above what the step started with (kiln::memory_meter, after a first step so that
// gradients and optimizer state exist) and the median step time over R rounds of S steps.
// Accumulation: N = 1, 2, 4 micro-batches of 16 sequences per optimizer step, same measures:
// memory should stay flat in N and time grow linearly. Output: one JSON object per line.
#include <kiln/kiln.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

kiln::models::gpt_settings model_settings() {
  return {.vocab_size = 64, .seq_len = 64, .d_model = 128, .n_layer = 12, .n_head = 4, .mlp_ratio = 4, .dropout = 0.1};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Checkpointing>
void measure(const char* name, const kiln::data::tensor_pair& data, std::int64_t micro_steps, std::int64_t batch,
             typename Checkpointing::settings settings, std::int64_t steps, std::int64_t rounds) {
  torch::manual_seed(0);
  kiln::models::gpt model(model_settings());
  kiln::accelerator<kiln::optim::adamw, Checkpointing> acc(
      {.accumulation = {.steps = micro_steps}, .checkpointing = settings, .optimizer = {.lr = 3e-4}});
  acc.prepare(model);
  kiln::data::batch_loader loader(data, {.batch_size = batch});
  auto optimizer_step = [&] {
    for (std::int64_t m = 0; m < micro_steps; ++m) {
      auto b = loader.next();
      torch::Tensor loss;
      {
        auto cast = acc.autocast();
        auto logits = model->forward(b.inputs);
        loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.targets.reshape({-1}));
      }
      acc.backward(loss);
      acc.step();
    }
  };
  optimizer_step();
  kiln::memory_meter meter;
  meter.start();
  optimizer_step();
  const auto peak = meter.peak();
  meter.stop();
  std::vector<double> times;
  for (std::int64_t r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t s = 0; s < steps; ++s) optimizer_step();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps);
  }
  std::printf("{\"case\": \"%s\", \"micro_steps\": %lld, \"micro_batch\": %lld, \"peak_step_bytes\": %lld, \"step_ms\": %.3f}\n",
              name, (long long)micro_steps, (long long)batch, (long long)peak, median(times));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t threads = 2, steps = 5, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::stoll(argv[i + 1]);
  }
  at::set_num_threads(static_cast<int>(threads));
  auto data = kiln::data::make_token_sequences(2048, 64, 64, 0);
  using namespace kiln::checkpointing;
  measure<none>("checkpointing none", data, 1, 32, {}, steps, rounds);
  measure<blocks>("checkpointing blocks", data, 1, 32, {}, steps, rounds);
  measure<every_nth>("checkpointing every-2nd", data, 1, 32, {.every = 2}, steps, rounds);
  for (std::int64_t n : {1, 2, 4}) measure<none>("accumulation", data, n, 16, {}, steps, rounds);
  return 0;
}
