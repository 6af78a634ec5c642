// Tests for kiln::models::dropout: the Philox generator against Random123's known answers, every
// element's keep decision against a scalar recomputation of the documented layout, the output
// and gradient against plain tensor arithmetic, and the properties training relies on (seeded,
// independent of the thread count, identity in eval, nothing kept for backward).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/models/detail/dropout_kernel.hpp"  // the kernel itself, besides the op
#include "kiln/models/dropout.hpp"
#include "kiln/profiler/memory_meter.hpp"

#include <doctest/doctest.h>

namespace {

namespace d = kiln::detail;

// The key the next dropout call will draw after torch::manual_seed(seed).
std::uint64_t key_after_seed(std::uint64_t seed) {
  torch::manual_seed(seed);
  auto* generator = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(generator->mutex_);
  return generator->random64();
}

// Element i's keep decision, one Philox call per element, from the layout in dropout_kernel.hpp.
std::vector<std::uint8_t> expected_keep(std::uint64_t key, std::int64_t n, double p) {
  const auto threshold = static_cast<std::uint32_t>(std::ldexp(1.0 - p, 32));
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t block = static_cast<std::uint64_t>(i / 32) * 8 + static_cast<std::uint64_t>(i % 8);
    const auto words = d::philox4x32_10({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0, 0},
                                        {static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32)});
    keep[static_cast<std::size_t>(i)] = words[static_cast<std::size_t>((i % 32) / 8)] < threshold;
  }
  return keep;
}

// Bytes LibTorch allocates in `f` and still holds when it returns, the returned tensor's included.
template <class F>
std::int64_t bytes_held_after(F&& f) {
  kiln::memory_meter meter;
  meter.start();
  auto kept = f();
  meter.stop();
  return meter.current();
}

torch::Tensor as_tensor(std::vector<std::uint8_t> v) {
  return torch::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, torch::kUInt8).clone();
}

}  // namespace

TEST_SUITE("dropout") {
  TEST_CASE("Philox4x32-10 gives Random123's known answers") {
    using words = std::array<std::uint32_t, 4>;
    CHECK(d::philox4x32_10({0, 0, 0, 0}, {0, 0}) == words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
    CHECK(d::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
          words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
    CHECK(d::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
          words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  }

  TEST_CASE("every element is kept or dropped as the documented Philox layout says, and scaled by 1/(1-p)") {
    // An odd size: whole groups of 32 take the vector path, the last partial group the scalar one.
    const std::int64_t n = 100003;
    for (const double p : {0.1, 0.5, 0.9}) {
      CAPTURE(p);
      const auto key = key_after_seed(11);
      torch::manual_seed(11);
      const auto x = torch::randn({n}) + 3.0;  // no zeros of its own
      torch::manual_seed(11);
      const auto y = kiln::models::apply_dropout(x, p, true);
      const auto keep = as_tensor(expected_keep(key, n, p)).to(torch::kBool);
      CHECK(torch::equal(y != 0, keep));
      const auto scale = static_cast<float>(1.0 / (1.0 - p));
      CHECK(torch::equal(y.masked_select(keep), x.masked_select(keep) * scale));
      // The kept fraction is 1 - p within 5 standard deviations.
      const double kept = keep.to(torch::kFloat64).mean().item<double>();
      CHECK(std::abs(kept - (1.0 - p)) < 5.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(n)));
    }
  }

  // A process uses one kernel (AVX-512, AVX2 or the baseline, by its CPU): each is run here directly,
  // so the baseline one that a machine without AVX2 dispatches to is checked on every machine, and
  // the portable one (non-x86 CPUs, Clang) on x86 too. Ranges start at an odd group and end at a
  // partial one, so AVX-512's two groups per call meet both edges.
  TEST_CASE("each instruction set's kernel keeps the documented elements, in fp32, bf16 and fp16") {
    const std::int64_t n = 32 * 41 + 7;  // whole groups and a partial one
    const std::int64_t groups = (n + d::dropout_group_size - 1) / d::dropout_group_size;
    const auto key = key_after_seed(5);
    torch::manual_seed(5);
    const auto mask = d::draw_dropout_mask(0.3);
    const auto keep = as_tensor(expected_keep(key, n, 0.3)).to(torch::kBool);
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
      const std::string dtype_name = c10::toString(dtype);
      CAPTURE(dtype_name);
      const auto x = (torch::randn({n}) + 3.0).to(dtype);
      const auto expected = (x.to(torch::kFloat32) * mask.scale).to(dtype) * keep;
      d::with_lane_storage(dtype, [&]<class T>(std::type_identity<T>) {
        const auto check = [&](const std::string& kernel_name, auto kernel) {
          CAPTURE(kernel_name);
          auto out = torch::empty_like(x);
          kernel(mask, 0, 1, n, x.data_ptr<T>(), out.data_ptr<T>());
          kernel(mask, 1, groups, n, x.data_ptr<T>(), out.data_ptr<T>());
          CHECK(torch::equal(out, expected));
        };
        check("portable", [](auto&&... a) { d::masked_scale_range<d::philox_generic, 4>(a...); });
        check("baseline", [](auto&&... a) { d::masked_scale_baseline(a...); });
#ifdef KILN_GCC_X86
        if (d::cpu_has_avx2()) check("avx2", [](auto&&... a) { d::masked_scale_avx2(a...); });
        else MESSAGE("no AVX2 here: its dropout kernel is not checked");
        if (d::cpu_has_avx512()) check("avx512", [](auto&&... a) { d::masked_scale_avx512(a...); });
        else MESSAGE("no AVX-512 here: its dropout kernel is not checked");
#endif
      });
    }
  }

  TEST_CASE("the gradient is the incoming gradient masked and scaled the same way, in fp32, bf16 and fp16") {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
      const std::string dtype_name = c10::toString(dtype);
      CAPTURE(dtype_name);
      torch::manual_seed(3);
      const auto x = (torch::randn({37, 129}) + 3.0).to(dtype).requires_grad_(true);
      const auto w = torch::randn({37, 129}).to(dtype);
      const auto y = kiln::models::apply_dropout(x, 0.3, true);
      CHECK((y.scalar_type() == dtype));
      (y * w).sum().backward();
      const auto keep = y != 0;
      const auto scale = static_cast<float>(1.0 / 0.7);
      // Forward and backward each round x * scale once to the tensor's dtype.
      const auto expected_y = (x.detach().to(torch::kFloat32) * scale).to(dtype) * keep;
      const auto expected_grad = (w.to(torch::kFloat32) * scale).to(dtype) * keep;
      CHECK(torch::equal(y.detach(), expected_y));
      CHECK((x.grad().scalar_type() == dtype));
      CHECK(torch::equal(x.grad(), expected_grad));
    }
  }

  TEST_CASE("masks follow torch::manual_seed, differ between calls, and do not depend on the thread count") {
    const auto x = torch::ones({64, 1000});
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    torch::manual_seed(5);
    const auto one_thread = kiln::models::apply_dropout(x, 0.2, true);
    const auto next_call = kiln::models::apply_dropout(x, 0.2, true);
    at::set_num_threads(2);
    torch::manual_seed(5);
    const auto two_threads = kiln::models::apply_dropout(x, 0.2, true);
    at::set_num_threads(threads);
    CHECK(torch::equal(one_thread, two_threads));
    CHECK(!torch::equal(one_thread, next_call));
  }

  TEST_CASE("eval mode and p = 0 are the identity, p = 1 drops everything, bad p is an error") {
    const auto x = torch::randn({10, 10});
    kiln::models::dropout drop(0.5);
    drop->eval();
    CHECK(drop->forward(x).is_same(x));
    CHECK(kiln::models::apply_dropout(x, 0.0, true).is_same(x));
    CHECK(torch::equal(kiln::models::apply_dropout(x, 1.0, true), torch::zeros_like(x)));
    CHECK_THROWS_AS(kiln::models::dropout(1.5), kiln::config_error);
    CHECK_THROWS_AS(kiln::models::apply_dropout(x, -0.1, true), kiln::config_error);
  }

  TEST_CASE("dtypes the fused kernel does not take go to LibTorch's dropout") {
    torch::manual_seed(0);
    const auto x = torch::ones({200, 100}, torch::kFloat64);
    const auto y = kiln::models::apply_dropout(x, 0.5, true);
    CHECK((y.scalar_type() == torch::kFloat64));
    const auto kept = y != 0;
    CHECK(torch::equal(y.masked_select(kept), torch::full({kept.sum().item<std::int64_t>()}, 2.0, torch::kFloat64)));
    CHECK(std::abs(kept.to(torch::kFloat64).mean().item<double>() - 0.5) < 0.05);
  }

  TEST_CASE("dropout keeps nothing for backward: the bytes held after forward are its output's") {
    const auto x = torch::randn({256, 1000}, torch::kFloat32).requires_grad_(true);
    torch::Tensor y;
    const auto held = bytes_held_after([&] { return y = kiln::models::apply_dropout(x, 0.3, true); });
    CHECK(held == static_cast<std::int64_t>(y.nbytes()));
    // LibTorch's keeps a mask as wide as the input besides (the reference this improves on).
    const auto libtorch_held = bytes_held_after([&] { return torch::dropout(x, 0.3, true); });
    CHECK(libtorch_held >= 2 * static_cast<std::int64_t>(y.nbytes()));
    // and the recomputed mask is the forward's
    y.backward(torch::ones_like(y));
    CHECK(torch::equal(x.grad() != 0, y != 0));
  }
}
