// kiln_bench_precision: the mixed-precision recipe's GPT under each precision policy.
//
//   kiln_bench_precision --threads N --steps S --rounds R [--warmup W]   (bench/run_precision drives it)
//   kiln_bench_precision --device cuda --d-model 1024 --layers 8 --seq 256 --batch 32
//                                                          (a GPU: tools/device-check runs this)
//
// Per precision: median step time over rounds (after W warm-up steps on a model of their own;
// the rounds then continue one model, each with a fresh trainer and optimizer; round r runs
// every precision once, so each precision's step time against fp32's is also given as the
// median of per-round ratios, which a busy minute on a shared machine does not skew), the peak
// memory LibTorch allocates during one training step above what the step started with
// (activations kept for backward, gradients, temporaries: kiln::memory_meter), the bytes of
// parameters + gradients + optimizer state (+ fp32 masters for bf16-pure; its Kahan variant's
// compensation buffers are optimizer state), and the eval loss and
// next-token accuracy after S x R steps of training. fp16 runs on a CUDA device, and on the CPU
// where LibTorch's CPU autocast has float16 (PyTorch 2.x; 1.13's is bf16-only). The defaults are
// the recipe's small GPT on the CPU; a GPU needs a larger one (--d-model, --layers, --seq,
// --batch) to be limited by its arithmetic rather than by kernel launches. Output: one JSON
// object per precision, one per line.
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

struct options {
  std::string device = "cpu";
  std::int64_t threads = 2, steps = 50, rounds = 5, warmup = 5;
  std::int64_t d_model = 128, layers = 4, heads = 4, seq = 64, batch = 32, vocab = 64;
};

kiln::models::gpt_settings model_settings(const options& o) {
  return {.vocab_size = o.vocab, .seq_len = o.seq, .d_model = o.d_model, .n_layer = o.layers, .n_head = o.heads,
          .mlp_ratio = 4, .dropout = 0.1};
}

struct result {
  double step_ms = 0, vs_fp32 = 1, eval_loss = 0, eval_accuracy = 0;
  std::int64_t peak_step_bytes = 0, held_bytes = 0;
};

// One precision's contender: its memory figures (measured when it is made), and its rounds,
// which main() interleaves with the other precisions' so that a slow minute on a shared machine
// falls on all of them alike.
struct contender {
  std::string name;
  result out;
  std::function<double()> round;     // `steps` steps; seconds per step
  std::function<void(result&)> evaluate;
  std::vector<double> times;
};

template <class Precision>
contender measure(std::string name, const kiln::data::tensor_pair& train, const kiln::data::tensor_pair& eval,
                  const options& o, const typename Precision::settings& precision = {}) {
  using trainer_t = kiln::trainer<Precision, kiln::optim::adamw>;
  contender c{.name = std::move(name)};
  result& out = c.out;
  // Memory: one step through the accelerator with a meter around it (after a first step, so
  // that gradients and optimizer state already exist, as in every later step).
  {
    torch::manual_seed(0);
    kiln::models::gpt model(model_settings(o));
    kiln::accelerator<Precision, kiln::optim::adamw> acc(
        {.precision = precision, .optimizer = {.lr = 1e-3}, .device = o.device});
    acc.prepare(model);
    kiln::data::batch_loader loader(train, {.batch_size = o.batch});
    auto step = [&] {
      auto batch = loader.next();
      const auto inputs = acc.place(batch.inputs), targets = acc.place(batch.targets);
      torch::Tensor loss;
      {
        auto cast = acc.autocast();
        auto logits = model->forward(inputs);
        loss = kiln::models::cross_entropy(logits, targets);  // the trainer's loss
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
    // (under Kahan summation the optimizer's parameters are the model's, and its compensation
    // buffers are in state_bytes)
    if constexpr (requires { acc.precision().master_bytes(); })
      if (acc.precision().master_bytes() > 0)
        for (const auto& m : acc.parameters()) out.held_bytes += bytes(m) + bytes(m.grad());
    out.held_bytes += acc.optimizer().state_bytes();
  }
  typename trainer_t::settings s;
  s.accelerator.precision = precision;
  s.accelerator.optimizer.lr = 1e-3;
  s.accelerator.device = o.device;
  s.options.progress = false;
  s.options.log_every = 1 << 30;
  // Warm-up: a few steps on a model of its own, as the Python side does, so that the first
  // timed round does not pay for the process's first kernels and allocations.
  if (o.warmup > 0) {
    torch::manual_seed(0);
    kiln::models::gpt model(model_settings(o));
    kiln::data::batch_loader loader(train, {.batch_size = o.batch});
    s.options.steps = o.warmup;
    trainer_t(s).fit(model, loader);
  }
  // Time and quality: rounds of `steps` steps, continuing the same model, each with a fresh
  // trainer and optimizer (the policy, and what it registers, lives for its round only).
  torch::manual_seed(0);
  struct state {
    kiln::models::gpt model;
    kiln::data::batch_loader loader;
    typename trainer_t::settings settings;
  };
  auto st = std::make_shared<state>(state{kiln::models::gpt(model_settings(o)),
                                          kiln::data::batch_loader(train, {.batch_size = o.batch}), s});
  st->settings.options.steps = o.steps;
  c.round = [st, steps = o.steps] {
    trainer_t t(st->settings);
    return t.fit(st->model, st->loader).seconds / static_cast<double>(steps);
  };
  c.evaluate = [st, eval](result& r) {
    trainer_t t(st->settings);
    const auto quality = t.evaluate(st->model, eval);
    r.eval_loss = quality.loss, r.eval_accuracy = quality.accuracy;
  };
  return c;
}

void print(const char* name, const result& r) {
  std::printf("{\"precision\": \"%s\", \"step_ms\": %.3f, \"step_vs_fp32\": %.4f, \"peak_step_bytes\": %lld, "
              "\"held_bytes\": %lld, \"eval_loss\": %.4f, \"eval_accuracy\": %.4f}\n",
              name, r.step_ms, r.vs_fp32, (long long)r.peak_step_bytes, (long long)r.held_bytes, r.eval_loss,
              r.eval_accuracy);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const kiln_bench::flags flags(argc, argv,
                                {"--device", "--threads", "--steps", "--rounds", "--warmup", "--d-model", "--layers",
                                 "--heads", "--seq", "--batch", "--vocab"});
  options o;
  o.device = flags.text("--device", o.device);
  for (auto [name, field] : {std::pair{"--threads", &o.threads}, {"--steps", &o.steps}, {"--rounds", &o.rounds},
                             {"--warmup", &o.warmup}, {"--d-model", &o.d_model}, {"--layers", &o.layers},
                             {"--heads", &o.heads}, {"--seq", &o.seq}, {"--batch", &o.batch}, {"--vocab", &o.vocab}})
    *field = flags.integer(name, *field);
  at::set_num_threads(static_cast<int>(o.threads));
  bool cuda = false;
  try {
    cuda = kiln::resolve_device(o.device, "--device").is_cuda();
  } catch (const kiln::config_error& e) {
    std::fprintf(stderr, "kiln_bench_precision: %s\n", e.what());
    return 2;
  }
  auto all = kiln::data::make_token_sequences(4096 + 512, o.seq, o.vocab, 0);
  kiln::data::tensor_pair train{all.inputs.slice(0, 0, 4096), all.targets.slice(0, 0, 4096)};
  kiln::data::tensor_pair eval{all.inputs.slice(0, 4096), all.targets.slice(0, 4096)};
  std::vector<contender> contenders;
  contenders.push_back(measure<kiln::precision::fp32>("fp32", train, eval, o));
  contenders.push_back(measure<kiln::precision::bf16>("bf16", train, eval, o));
  contenders.push_back(measure<kiln::precision::bf16_pure>("bf16-pure", train, eval, o));
  contenders.push_back(measure<kiln::precision::bf16_pure>("bf16-pure-kahan", train, eval, o, {.kahan = true}));
  if (cuda || kiln::detail::cpu_half_autocast_failure().empty())
    contenders.push_back(measure<kiln::precision::fp16>("fp16", train, eval, o));
  // Round r runs every precision once, starting from a different one each round.
  const auto n = contenders.size();
  for (std::int64_t r = 0; r < o.rounds; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      auto& c = contenders[(i + static_cast<std::size_t>(r)) % n];
      c.times.push_back(c.round());
    }
  for (auto& c : contenders) {
    c.out.step_ms = 1e3 * median(c.times);
    // Against fp32 (the first): the median of the rounds' ratios, each from minutes apart at most.
    std::vector<double> ratios;
    for (std::size_t r = 0; r < c.times.size(); ++r) ratios.push_back(c.times[r] / contenders.front().times[r]);
    c.out.vs_fp32 = median(ratios);
    c.evaluate(c.out);
    print(c.name.c_str(), c.out);
  }
  return 0;
}
