// kiln_bench_optim: optimizer-step time and state bytes of kiln's optimizers, against
// LibTorch's own AdamW and SGD and against the memory-bandwidth bound of each rule.
//
//   kiln_bench_optim --threads N --rounds R   (bench/run_optimizers drives it)
//
// Parameters: the quickstart MLP (784-256-256-10, 0.27 M) and a wider one (784-2048-2048-10,
// 5.8 M), with fixed random gradients. Each round times 20 optimizer steps of every optimizer in
// turn (paired rounds: neighbours on a shared machine disturb all alike); reported is the median
// over rounds. Bound: the bytes each rule must read and write per parameter (fp32 parameter,
// gradient and state) at the in-place stream bandwidth measured in the same run. Output: JSON lines.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>

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

using named_tensors = std::vector<std::pair<std::string, torch::Tensor>>;

named_tensors make_parameters(std::int64_t hidden) {
  torch::manual_seed(0);
  kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 784, .hidden = {hidden, hidden}, .classes = 10});
  named_tensors out;
  for (auto& item : model->named_parameters()) {
    auto p = item.value().detach().clone().requires_grad_();
    p.mutable_grad() = torch::randn_like(p) * 1e-2;
    out.emplace_back(item.key(), p);
  }
  return out;
}

struct contender {
  std::string name;
  double bytes_per_parameter;  // what the rule must move at least (fp32 parameters)
  std::function<void()> step;
  std::function<std::int64_t()> state_bytes;
  std::vector<double> ms;
};

// Bytes per second of an in-place a += b over 64 MiB arrays: read a and b, write a, the access
// pattern of an in-place update rule (a copy also reads its destination in before writing it,
// uncounted, and measured below what kiln's AdamW moves). Best of 3, measured in every round
// beside the optimizers and the best round taken: one measurement on a shared machine can land
// in a slow moment and make the bound slower than the optimizers it bounds.
double stream_bandwidth() {
  static auto src = torch::randn({16 << 20}), dst = torch::randn({16 << 20});
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    auto start = std::chrono::steady_clock::now();
    dst.add_(src);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 3.0 * static_cast<double>(src.numel()) * 4 / best;
}

// Neither kind of optimizer has zero_grad called: every step sees the same gradients.
void run(const char* model, std::int64_t hidden, std::int64_t rounds) {
  std::vector<contender> all;
  std::vector<named_tensors> owned;
  auto add_kiln = [&]<class Optimizer>(std::string name, double bytes, typename Optimizer::settings s) {
    owned.push_back(make_parameters(hidden));
    auto opt = std::make_shared<Optimizer>(s);
    opt->attach(owned.back());
    all.push_back({std::move(name), bytes, [opt] { opt->step(); }, [opt] { return opt->state_bytes(); }, {}});
  };
  auto add_libtorch = [&]<class Optimizer, class Options>(std::string name, double bytes, Options options) {
    owned.push_back(make_parameters(hidden));
    std::vector<torch::Tensor> tensors;
    for (auto& [n, p] : owned.back()) tensors.push_back(p);
    auto opt = std::make_shared<Optimizer>(tensors, options);
    auto* params = &owned.back();
    all.push_back({std::move(name), bytes, [opt] { opt->step(); },
                   [params] {  // LibTorch's state: the same moments as the rule keeps
                     std::int64_t n = 0;
                     for (auto& [name, p] : *params) n += p.numel();
                     return n;
                   },
                   {}});
  };
  owned.reserve(16);  // the lambdas keep pointers into it
  // fp32 bytes per parameter: read p, g and the state, write p and the state.
  add_kiln.operator()<kiln::optim::adamw>("kiln adamw", 28, {.lr = 1e-3});
  add_libtorch.operator()<torch::optim::AdamW>("LibTorch AdamW", 28, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  add_kiln.operator()<kiln::optim::sgd>("kiln sgd (momentum)", 20, {.lr = 0.1, .momentum = 0.9});
  add_libtorch.operator()<torch::optim::SGD>("LibTorch SGD (momentum)", 20, torch::optim::SGDOptions(0.1).momentum(0.9));
  add_kiln.operator()<kiln::optim::lion>("kiln lion", 20, {.lr = 1e-4});
  add_kiln.operator()<kiln::optim::adafactor>("kiln adafactor", 12, {});
  add_kiln.operator()<kiln::optim::adam8bit>("kiln adam8bit", 16, {.lr = 1e-3});

  std::int64_t parameters = 0;
  for (auto& [n, p] : owned.front()) parameters += p.numel();
  for (auto& c : all) c.step();  // state exists from here on
  double bandwidth = 0.0;
  for (std::int64_t r = 0; r < rounds; ++r) {
    bandwidth = std::max(bandwidth, stream_bandwidth());
    for (auto& c : all) {
      auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < 20; ++s) c.step();
      c.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / 20);
    }
  }
  for (auto& c : all) {
    const bool libtorch = c.name.rfind("LibTorch", 0) == 0;
    const double state = libtorch ? -1.0 : static_cast<double>(c.state_bytes()) / static_cast<double>(parameters);
    std::printf(
        "{\"model\": \"%s\", \"parameters\": %lld, \"optimizer\": \"%s\", \"step_ms\": %.4f, "
        "\"bound_ms\": %.4f, \"state_bytes_per_parameter\": %.3f, \"bandwidth_gbs\": %.2f}\n",
        model, (long long)parameters, c.name.c_str(), median(c.ms),
        1e3 * c.bytes_per_parameter * static_cast<double>(parameters) / bandwidth, state, bandwidth / 1e9);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const kiln_bench::flags flags(argc, argv, {"--threads", "--rounds"});
  const std::int64_t threads = flags.integer("--threads", 2), rounds = flags.integer("--rounds", 9);
  at::set_num_threads(static_cast<int>(threads));
  torch::NoGradGuard no_grad;
  run("mlp 784-256-256-10", 256, rounds);
  run("mlp 784-2048-2048-10", 2048, rounds);
  return 0;
}
