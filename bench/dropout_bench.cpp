// kiln_bench_dropout: the time of one dropout forward (p = 0.1, training) on a tensor of 4 M
// elements, kiln's against LibTorch's own and against the memory bound, in fp32 and bf16.
//
//   kiln_bench_dropout --threads N --rounds R   (bench/run_dropout drives it)
//
// kiln's rows: kiln::models::apply_dropout (what the models call: the CPU's own kernel), and each
// instruction set's kernel that this CPU can run, called the way apply_dropout calls it (so the
// table shows what AVX-512 and AVX2 each bring). LibTorch's row: torch::dropout, which draws its
// mask with bernoulli_. Bound: reading the input and writing the output once at the copy
// bandwidth measured in the same round. Paired rounds: each round times every contender in turn;
// reported is the median over rounds. Output: JSON lines.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/models/detail/dropout_kernel.hpp>  // the kernel itself, besides the op

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <ranges>
#include <string>
#include <vector>

namespace {

using kiln_bench::median;

namespace d = kiln::detail;

constexpr std::int64_t elements = std::int64_t{1} << 22;
constexpr double p = 0.1;
constexpr int calls_per_round = 10;

struct contender {
  std::string name;
  std::function<void()> call;
  std::vector<double> ms;
};

// One instruction set's kernel over the whole tensor, threaded as masked_scale_loop threads it.
template <class T, class Kernel>
std::function<void()> kernel_call(const torch::Tensor& x, torch::Tensor& out, Kernel kernel) {
  return [&x, &out, kernel] {
    const auto mask = d::draw_dropout_mask(p);
    const std::int64_t n = x.numel(), groups = (n + d::dropout_group_size - 1) / d::dropout_group_size;
    const T* in = x.data_ptr<T>();
    T* dst = out.data_ptr<T>();
    at::parallel_for(0, groups, d::dropout_grain_groups,
                     [&](std::int64_t first, std::int64_t last) { kernel(mask, first, last, n, in, dst); });
  };
}

template <class T>
void run(torch::ScalarType dtype, std::int64_t rounds) {
  const auto x = torch::randn({elements}).to(dtype);
  auto out = torch::empty_like(x), copy = torch::empty_like(x);
  std::vector<contender> all;
  all.push_back({"copy (the bound)", [&] { copy.copy_(x); }, {}});
  all.push_back({"kiln apply_dropout", [&] { out = kiln::models::apply_dropout(x, p, true); }, {}});
#ifdef KILN_GCC_X86
  if (d::cpu_has_avx512())
    all.push_back({"kiln, AVX-512 kernel", kernel_call<T>(x, out, [](auto&&... a) { d::masked_scale_avx512(a...); }), {}});
  if (d::cpu_has_avx2())
    all.push_back({"kiln, AVX2 kernel", kernel_call<T>(x, out, [](auto&&... a) { d::masked_scale_avx2(a...); }), {}});
#endif
  all.push_back({"kiln, baseline kernel", kernel_call<T>(x, out, [](auto&&... a) { d::masked_scale_baseline(a...); }), {}});
  all.push_back({"LibTorch torch::dropout", [&] { out = torch::dropout(x, p, true); }, {}});
  for (auto& c : all) c.call();
  for (std::int64_t r = 0; r < rounds; ++r) {
    for (auto& c : all) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < calls_per_round; ++i) c.call();
      c.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                     calls_per_round);
    }
  }
  const double bound_ms = median(all.front().ms);
  for (auto& c : all | std::views::drop(1))
    std::printf("{\"dtype\": \"%s\", \"elements\": %lld, \"contender\": \"%s\", \"ms\": %.4f, \"bound_ms\": %.4f}\n",
                c10::toString(dtype), (long long)elements, c.name.c_str(), median(c.ms), bound_ms);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const kiln_bench::flags flags(argc, argv, {"--threads", "--rounds"});
  const std::int64_t threads = flags.integer("--threads", 2), rounds = flags.integer("--rounds", 9);
  at::set_num_threads(static_cast<int>(threads));
  torch::NoGradGuard no_grad;
  run<float>(torch::kFloat32, rounds);
  run<c10::BFloat16>(torch::kBFloat16, rounds);
  return 0;
}
