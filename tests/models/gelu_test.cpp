// kiln::models::gelu against LibTorch's gelu in fp64: values and gradients in fp32 within what
// the erfc approximation and fp32 arithmetic allow, in bf16 and fp16 within one rounding of the
// exact value, both vector widths of the kernel alike, NaN and the far tails, and the inputs it
// leaves to LibTorch.
#include <cmath>
#include <limits>

#include "kiln/models/detail/gelu_kernel.hpp"  // the kernel itself, besides the op
#include "kiln/models/gelu.hpp"

#include <doctest/doctest.h>

namespace {

struct gelu_result {
  torch::Tensor y, dx;
};

// kiln: the kernel's autograd node (what kiln::models::gelu runs for bf16 and fp16), for any dtype
// it takes; otherwise LibTorch's gelu.
gelu_result run(const torch::Tensor& input, const torch::Tensor& upstream, bool kiln) {
  auto x = input.detach().clone().requires_grad_(true);
  auto y = kiln ? kiln::detail::gelu_function::apply(x) : torch::gelu(x);
  (y * upstream.to(y.scalar_type())).sum().backward();
  return {y.detach(), x.grad()};
}

// The exact values, from LibTorch's fp64 gelu of the same inputs.
gelu_result exact(const torch::Tensor& x, const torch::Tensor& upstream) {
  return run(x.to(torch::kFloat64), upstream.to(torch::kFloat64), false);
}

// Every element within `relative` of the exact value, or `absolute` where that is larger.
bool close_to(const torch::Tensor& a, const torch::Tensor& exact, double relative, double absolute) {
  const auto e = exact.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - e).abs() <= torch::clamp_min(e.abs() * relative, absolute)).all().item<bool>();
}

// Every element within `relative` of the exact value plus an error of its own (a tensor).
bool within(const torch::Tensor& a, const torch::Tensor& exact, double relative, const torch::Tensor& error) {
  const auto e = exact.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - e).abs() <= e.abs() * relative + error.to(torch::kFloat64)).all().item<bool>();
}

}  // namespace

TEST_SUITE("gelu") {
  TEST_CASE("fp32: values and gradients within a few ulps of the exact function, lengths in and out of vector width") {
    // The erfc approximation errs by at most 1.5e-7 (absolute) in erf, so by 7.5e-8 in Phi; with
    // fp32's rounding of a few operations that is within 4e-7 of Phi, times |x| in gelu.
    for (const std::int64_t n : {4096, 37, 3}) {
      CAPTURE(n);
      torch::manual_seed(n);
      const auto x = 3.0 * torch::randn({n});
      const auto upstream = torch::randn({n});
      const auto k = run(x, upstream, true), e = exact(x, upstream);
      CHECK((k.y.scalar_type() == torch::kFloat32));
      CHECK(close_to(k.y, e.y, 4e-7, 4e-7 * x.abs().max().item<double>()));
      CHECK(close_to(k.dx, e.dx, 1e-6, 1e-6 * upstream.abs().max().item<double>()));
    }
  }

  TEST_CASE("the far tails, zero and NaN") {
    const auto x = torch::tensor({-30.0f, -10.0f, -6.0f, 0.0f, 6.0f, 10.0f, 30.0f, std::numeric_limits<float>::quiet_NaN()});
    const auto y = kiln::detail::gelu_forward_cpu(x), ref = torch::gelu(x.to(torch::kFloat64));
    for (int i = 0; i < 7; ++i) {
      CAPTURE(i);
      CHECK(std::abs(y[i].item<double>() - ref[i].item<double>()) <= 1e-7 * std::max(1.0, std::abs(ref[i].item<double>())));
    }
    CHECK(std::isnan(y[7].item<float>()));
  }

  TEST_CASE("bf16 and fp16: fp32 arithmetic, each result within a rounding of the exact one") {
    for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
      CAPTURE(dtype);
      torch::manual_seed(11);
      const auto x = (3.0 * torch::randn({5000})).to(dtype);
      const auto upstream = torch::randn({5000}).to(dtype);
      const auto k = run(x, upstream, true), e = exact(x, upstream);
      CHECK((k.y.scalar_type() == dtype));
      CHECK((k.dx.scalar_type() == dtype));
      // Half an ulp of the storage type (relative: up to 2^-8 for bf16, 2^-11 for fp16; fp16's
      // subnormals: 2^-25 absolute), after the fp32 result's own error (the first test's bounds),
      // which can tip the rounding to the other neighbour: at x = -3.01, y = -0.00391,
      // LibTorch's fp32 gelu rounded to fp16 does too.
      const bool bf16 = dtype == torch::kBFloat16;
      const double half_ulp = bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const double subnormal = bf16 ? 0.0 : std::ldexp(1.0, -25);
      const auto x64 = x.to(torch::kFloat64), g64 = upstream.to(torch::kFloat64);
      CHECK(within(k.y, e.y, half_ulp, 4e-7 * torch::clamp_min(x64.abs(), 1.0) + subnormal));
      CHECK(within(k.dx, e.dx, half_ulp, 1e-6 * g64.abs() + subnormal));
    }
  }

  TEST_CASE("the 4-lane and 8-lane kernels agree bit for bit") {
    torch::manual_seed(5);
    const auto x = 3.0 * torch::randn({1003}), g = torch::randn({1003});
    auto y4 = torch::empty_like(x), d4 = torch::empty_like(x);
    kiln::detail::gelu_forward_range<4>(x.data_ptr<float>(), y4.data_ptr<float>(), 0, x.numel());
    kiln::detail::gelu_backward_range<4>(x.data_ptr<float>(), g.data_ptr<float>(), d4.data_ptr<float>(), 0, x.numel());
    CHECK(close_to(y4, torch::gelu(x.to(torch::kFloat64)), 4e-7, 4e-7 * x.abs().max().item<double>()));
#ifdef KILN_GCC_X86
    if (kiln::detail::cpu_has_avx2()) {
      auto y8 = torch::empty_like(x), d8 = torch::empty_like(x);
      kiln::detail::gelu_forward_avx2(x.data_ptr<float>(), y8.data_ptr<float>(), 0, x.numel());
      kiln::detail::gelu_backward_avx2(x.data_ptr<float>(), g.data_ptr<float>(), d8.data_ptr<float>(), 0, x.numel());
      CHECK(torch::equal(y4, y8));
      CHECK(torch::equal(d4, d8));
    } else {
      MESSAGE("skipped the 8-lane kernel: this CPU has no AVX2");
    }
#endif
  }

  TEST_CASE("what the kernel does not take goes to LibTorch's gelu: fp32, whose LibTorch kernel is faster, and fp64") {
    for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
      const auto x = torch::randn({10}, dtype);
      CHECK(torch::equal(kiln::models::gelu(x), torch::gelu(x)));
    }
  }
}
