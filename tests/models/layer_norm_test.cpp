// Tests for kiln::models::apply_layer_norm: its output and gradients (input, weight, bias)
// against LibTorch's layer_norm in fp64 over row lengths that do and do not fill a vector, in
// fp32, bf16 and fp16 storage, both vector widths of the kernel, independence from the thread
// count, the inputs it leaves to LibTorch, and inputs whose dtype is not the weights' (under bf16
// autocast, for kiln's and LibTorch's LayerNorm).
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kiln/models/detail/layer_norm_kernel.hpp"  // the kernel itself, besides the op
#include "kiln/models/layer_norm.hpp"
#include "kiln/precision/bf16.hpp"

#include <doctest/doctest.h>

namespace {

struct layer_norm_result {
  torch::Tensor y, dx, dw, db;
};

// Forward, then backward of sum(y * upstream), through `ln` applied by `apply`.
template <class Apply>
layer_norm_result run(torch::nn::LayerNorm& ln, const torch::Tensor& input, const torch::Tensor& upstream,
                      Apply&& apply) {
  auto x = input.detach().clone().requires_grad_(true);
  for (auto& p : ln->parameters()) p.mutable_grad() = torch::Tensor();
  auto y = apply(*ln, x);
  (y * upstream.to(y.scalar_type())).sum().backward();
  return {y.detach(), x.grad(), ln->weight.grad(), ln->bias.grad()};
}

// A LayerNorm over d with random weight and bias, in `dtype`.
torch::nn::LayerNorm make_layer_norm(std::int64_t d, torch::ScalarType dtype) {
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({d}));
  torch::NoGradGuard no_grad;
  ln->weight.copy_(1.0 + 0.5 * torch::randn({d}));
  ln->bias.copy_(0.3 * torch::randn({d}));
  ln->to(dtype);
  return ln;
}

// LibTorch's layer_norm on fp64 copies of the same (already rounded) values: the reference.
layer_norm_result reference(const torch::nn::LayerNorm& ln, const torch::Tensor& x, const torch::Tensor& upstream) {
  auto copy = torch::nn::LayerNorm(torch::nn::LayerNormOptions({x.size(-1)}));
  {
    torch::NoGradGuard no_grad;
    copy->to(torch::kFloat64);
    copy->weight.copy_(ln->weight);
    copy->bias.copy_(ln->bias);
  }
  return run(copy, x.to(torch::kFloat64), upstream.to(torch::kFloat64),
             [](torch::nn::LayerNormImpl& m, const torch::Tensor& t) { return m.forward(t); });
}

// Largest |a - b| relative to b's largest magnitude.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const auto b64 = b.to(torch::kFloat64);
  return (a.to(torch::kFloat64) - b64).abs().max().item<double>() / b64.abs().max().item<double>();
}

}  // namespace

TEST_SUITE("layer_norm") {
  TEST_CASE("output and gradients equal LibTorch's, fp32, for rows in and out of vector width") {
    for (const std::int64_t d : {128, 37, 8, 3}) {
      CAPTURE(d);
      torch::manual_seed(d);
      auto ln = make_layer_norm(d, torch::kFloat32);
      const auto x = 2.0 + 3.0 * torch::randn({4, 50, d});  // an offset mean, as residual streams have
      const auto upstream = torch::randn({4, 50, d});
      const auto kiln = run(ln, x, upstream, kiln::models::apply_layer_norm);
      const auto ref = reference(ln, x, upstream);
      CHECK(kiln.y.sizes() == x.sizes());
      CHECK(relative_difference(kiln.y, ref.y) < 1e-6);
      CHECK(relative_difference(kiln.dx, ref.dx) < 1e-5);
      CHECK(relative_difference(kiln.dw, ref.dw) < 1e-5);
      CHECK(relative_difference(kiln.db, ref.db) < 1e-5);
    }
  }

  TEST_CASE("bf16 and fp16: fp32 arithmetic, each result within a rounding of the exact one") {
    for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
      CAPTURE(dtype);
      torch::manual_seed(7);
      const std::int64_t d = 131;
      auto ln = make_layer_norm(d, dtype);
      const auto x = (1.0 + 2.0 * torch::randn({300, d})).to(dtype);
      const auto upstream = torch::randn({300, d}).to(dtype);
      const auto kiln = run(ln, x, upstream, kiln::models::apply_layer_norm);
      const auto ref = reference(ln, x, upstream);
      CHECK((kiln.y.scalar_type() == dtype));
      CHECK((kiln.dx.scalar_type() == dtype));
      CHECK((kiln.dw.scalar_type() == dtype));
      // One rounding to the storage type: half an ulp, 2^-8 relative for bf16 and 2^-11 for fp16,
      // and a little for the fp32 arithmetic before it.
      const double ulp = dtype == torch::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const auto within_rounding = [&](const torch::Tensor& a, const torch::Tensor& b) {
        const auto exact = b.to(torch::kFloat64);
        const auto bound = exact.abs() * ulp + 1e-5 * exact.abs().max();
        return ((a.to(torch::kFloat64) - exact).abs() <= bound).all().item<bool>();
      };
      CHECK(within_rounding(kiln.y, ref.y));
      CHECK(within_rounding(kiln.dx, ref.dx));
      CHECK(within_rounding(kiln.dw, ref.dw));
      CHECK(within_rounding(kiln.db, ref.db));
    }
  }

  TEST_CASE("the 4-lane and 8-lane kernels both agree with LibTorch") {
    torch::manual_seed(5);
    const std::int64_t rows = 40, d = 45;  // vectors of 4 and 8 and a tail
    auto ln = make_layer_norm(d, torch::kFloat32);
    const auto x = torch::randn({rows, d}) + 1.0;
    const auto upstream = torch::randn({rows, d});
    const auto ref = reference(ln, x, upstream);
    auto check_width = [&]<int Width>() {
      CAPTURE(Width);
      auto y = torch::empty_like(x), dx = torch::empty_like(x);
      std::vector<kiln::detail::row_moments> moments(rows);
      kiln::detail::layer_norm_forward_range<Width>(x.data_ptr<float>(), ln->weight.data_ptr<float>(),
                                                    ln->bias.data_ptr<float>(), y.data_ptr<float>(), moments.data(), 0,
                                                    rows, d, 1e-5f);
      std::vector<float> dw(d), db(d);
      kiln::detail::layer_norm_backward_range<Width>(x.data_ptr<float>(), ln->weight.data_ptr<float>(),
                                                     upstream.data_ptr<float>(), moments.data(), dx.data_ptr<float>(),
                                                     dw.data(), db.data(), 0, rows, d);
      CHECK(relative_difference(y, ref.y) < 1e-6);
      CHECK(relative_difference(dx, ref.dx) < 1e-5);
      CHECK(relative_difference(torch::tensor(dw), ref.dw) < 1e-5);
      CHECK(relative_difference(torch::tensor(db), ref.db) < 1e-5);
    };
    check_width.operator()<4>();
    check_width.operator()<8>();
  }

  TEST_CASE("results do not depend on the thread count") {
    torch::manual_seed(9);
    auto ln = make_layer_norm(96, torch::kBFloat16);
    const auto x = torch::randn({4096, 96}).to(torch::kBFloat16);
    const auto upstream = torch::randn({4096, 96});
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const auto one = run(ln, x, upstream, kiln::models::apply_layer_norm);
    at::set_num_threads(std::max(2, threads));
    const auto many = run(ln, x, upstream, kiln::models::apply_layer_norm);
    at::set_num_threads(threads);
    CHECK(torch::equal(one.y, many.y));
    CHECK(torch::equal(one.dx, many.dx));
    CHECK(torch::equal(one.dw, many.dw));
    CHECK(torch::equal(one.db, many.db));
  }

  TEST_CASE("what the kernel does not take goes to LibTorch's layer_norm unchanged") {
    torch::manual_seed(2);
    const auto upstream = torch::randn({6, 10});
    auto plain = [](torch::nn::LayerNormImpl& m, const torch::Tensor& t) { return m.forward(t); };
    SUBCASE("fp64") {
      auto ln = make_layer_norm(10, torch::kFloat64);
      const auto x = torch::randn({6, 10}, torch::kFloat64);
      const auto a = run(ln, x, upstream, kiln::models::apply_layer_norm), b = run(ln, x, upstream, plain);
      CHECK(torch::equal(a.y, b.y));
      CHECK(torch::equal(a.dw, b.dw));
    }
    SUBCASE("no weight and bias") {
      torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({10}).elementwise_affine(false));
      const auto x = torch::randn({6, 10});
      CHECK(torch::equal(kiln::models::apply_layer_norm(*ln, x), ln->forward(x)));
    }
    SUBCASE("more than one normalised dimension") {
      torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({2, 5}));
      const auto x = torch::randn({6, 2, 5});
      CHECK(torch::equal(kiln::models::apply_layer_norm(*ln, x), ln->forward(x)));
    }
  }
  TEST_CASE("input and weights of different dtypes under bf16 autocast, kiln's LayerNorm and LibTorch's: the input's dtype out") {
    // A Linear's bf16 output into a LayerNorm with fp32 weights (bf16 autocast), and an fp32
    // input into bf16 weights (bf16-pure): 1.13's layer_norm threw "expected scalar type". The
    // result has the input's dtype and is the fp32 layer norm of the same values within the
    // rounding of the weights and of the result to bf16 (2^-8 each, on values of a few units).
    torch::manual_seed(4);
    kiln::precision::bf16 policy;
    auto kiln_ln = [](torch::nn::LayerNormImpl& m, const torch::Tensor& t) { return kiln::models::apply_layer_norm(m, t); };
    auto torch_ln = [](torch::nn::LayerNormImpl& m, const torch::Tensor& t) { return m.forward(t); };
    const auto upstream = torch::randn({6, 40});
    for (const auto input_dtype : {torch::kBFloat16, torch::kFloat32}) {
      const auto weight_dtype = input_dtype == torch::kBFloat16 ? torch::kFloat32 : torch::kBFloat16;
      CAPTURE(input_dtype);
      auto ln = make_layer_norm(40, weight_dtype);
      const auto x = (1.0 + 2.0 * torch::randn({6, 40})).to(input_dtype);
      const auto reference = torch::layer_norm(x.to(torch::kFloat), {40}, ln->weight.to(torch::kFloat),
                                               ln->bias.to(torch::kFloat));
      for (int which = 0; which < 2; ++which) {
        CAPTURE(which);  // 0: kiln's, 1: LibTorch's
        layer_norm_result r;
        {
          auto cast = policy.autocast();
          r = which == 0 ? run(ln, x, upstream, kiln_ln) : run(ln, x, upstream, torch_ln);
        }
        CHECK((r.y.scalar_type() == input_dtype));
        CHECK((r.dw.scalar_type() == weight_dtype));  // the gradient reaches the weights in their own dtype
        CHECK(torch::allclose(r.y.to(torch::kFloat), reference, 0.02, 0.02));
        CHECK(r.dw.to(torch::kFloat).abs().sum().item<double>() > 0);
      }
    }
  }
}
