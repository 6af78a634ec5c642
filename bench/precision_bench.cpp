// kiln_bench_precision: the mixed-precision recipe's GPT under each precision policy.
//
//   kiln_bench_precision --threads N --steps S --rounds R   (bench/run_precision drives it)
//
// Per precision: median step time over rounds (fresh model each round, same data), the peak
// memory LibTorch allocates during one training step above what the step started with
// (activations kept for backward, gradients, temporaries: kiln::memory_meter), the bytes of
// parameters + gradients + optimizer state (+ fp32 masters for bf16-pure), and the eval loss and
// next-token accuracy after S x R steps of training. fp16 runs only where CUDA exists (LibTorch
// 1.13's CPU autocast is bf16-only). Output: one JSON object per precision, one per line.
#include <kiln/kiln.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

kiln::models::gpt_settings model_settings() {
  return {.vocab_size = 64, .seq_len = 64, .d_model = 128, .n_layer = 4, .n_head = 4, .mlp_ratio = 4, .dropout = 0.1};
}

struct result {
  double step_ms = 0, eval_loss = 0, eval_accuracy = 0;
  std::int64_t peak_step_bytes = 0, held_bytes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Precision>
result measure(const kiln::data::tensor_pair& train, const kiln::data::tensor_pair& eval, std::int64_t steps,
               std::int64_t rounds) {
  using trainer_t = kiln::trainer<Precision, kiln::optim::adamw>;
  result out;
  // Memory: one step through the accelerator with a meter around it (after a first step, so
  // that gradients and optimizer state already exist, as in every later step).
  {
    torch::manual_seed(0);
    kiln::models::gpt model(model_settings());
    kiln::accelerator<Precision, kiln::optim::adamw> acc({.optimizer = {.lr = 1e-3}});
    acc.prepare(model);
    kiln::data::batch_loader loader(train, {.batch_size = 32});
    auto step = [&] {
      auto batch = loader.next();
      torch::Tensor loss;
      {
        auto cast = acc.autocast();
        auto logits = model->forward(batch.inputs);
        loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1}));
      }
      acc.backward(loss);
      acc.step();
    };
    step();
    kiln::memory_meter meter;
    meter.start();
    step();
    out.peak_step_bytes = meter.peak();
    meter.stop();
    auto bytes = [](const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0; };
    for (const auto& p : model->parameters()) out.held_bytes += bytes(p) + bytes(p.grad());
    // bf16-pure: the optimizer's fp32 masters and their gradients, besides the model's bf16 weights
    if constexpr (requires { acc.precision().master_bytes(); })
      for (const auto& m : acc.parameters()) out.held_bytes += bytes(m) + bytes(m.grad());
    out.held_bytes += acc.optimizer().state_bytes();
  }
  // Time and quality: `rounds` fits of `steps` steps, continuing the same model.
  torch::manual_seed(0);
  kiln::models::gpt model(model_settings());
  kiln::data::batch_loader loader(train, {.batch_size = 32});
  std::vector<double> times;
  typename trainer_t::settings s;
  s.accelerator.optimizer.lr = 1e-3;
  s.options.progress = false;
  s.options.log_every = 1 << 30;
  kiln::fit_summary summary;
  for (std::int64_t r = 0; r < rounds; ++r) {
    s.options.steps = steps;
    trainer_t t(s);
    summary = t.fit(model, loader, r + 1 == rounds ? &eval : nullptr);
    times.push_back(summary.seconds / static_cast<double>(steps));
  }
  out.step_ms = 1e3 * median(times);
  out.eval_loss = summary.final_eval.loss;
  out.eval_accuracy = summary.final_eval.accuracy;
  return out;
}

void print(const char* name, const result& r) {
  std::printf("{\"precision\": \"%s\", \"step_ms\": %.3f, \"peak_step_bytes\": %lld, \"held_bytes\": %lld, "
              "\"eval_loss\": %.4f, \"eval_accuracy\": %.4f}\n",
              name, r.step_ms, (long long)r.peak_step_bytes, (long long)r.held_bytes, r.eval_loss, r.eval_accuracy);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t threads = 2, steps = 50, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::stoll(argv[i + 1]);
  }
  at::set_num_threads(static_cast<int>(threads));
  auto all = kiln::data::make_token_sequences(4096 + 512, 64, 64, 0);
  kiln::data::tensor_pair train{all.inputs.slice(0, 0, 4096), all.targets.slice(0, 0, 4096)};
  kiln::data::tensor_pair eval{all.inputs.slice(0, 4096), all.targets.slice(0, 4096)};
  print("fp32", measure<kiln::precision::fp32>(train, eval, steps, rounds));
  print("bf16", measure<kiln::precision::bf16>(train, eval, steps, rounds));
  print("bf16-pure", measure<kiln::precision::bf16_pure>(train, eval, steps, rounds));
  if (torch::cuda::is_available()) std::fprintf(stderr, "fp16: this benchmark runs on the CPU; see the README for CUDA\n");
  return 0;
}
