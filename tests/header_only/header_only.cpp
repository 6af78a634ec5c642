// kiln used header-only (the kiln::headers target, KILN_SEPARATE_KERNELS not defined): the ops
// with kernels of their own are inline and compiled here, and give LibTorch's values. kiln's
// other tests use kiln::kiln, where they come from kiln::kernels.
#include <cstdio>

#include <torch/torch.h>

#include "kiln/models/cross_entropy.hpp"
#include "kiln/models/dropout.hpp"
#include "kiln/models/gelu.hpp"
#include "kiln/models/layer_norm.hpp"

#ifdef KILN_SEPARATE_KERNELS
#error "this check is of the header-only build"
#endif

int main() {
  torch::manual_seed(0);
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) std::fprintf(stderr, "header-only: %s differs from LibTorch\n", what), ++failures;
  };
  const auto x = torch::randn({64, 10});
  const auto targets = torch::randint(0, 10, {64});
  expect(torch::allclose(kiln::models::cross_entropy(x, targets), torch::nn::functional::cross_entropy(x, targets)),
         "cross_entropy");
  expect(torch::allclose(kiln::models::gelu(x.to(torch::kBFloat16)).to(torch::kFloat32),
                         torch::gelu(x.to(torch::kBFloat16)).to(torch::kFloat32), 1e-2, 1e-2),
         "gelu (bf16)");
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({10}));
  expect(torch::allclose(kiln::models::apply_layer_norm(*ln, x), ln->forward(x), 1e-5, 1e-5), "layer_norm");
  // Dropout draws its own masks: each element is dropped (0) or kept and scaled by 1 / (1 - p).
  const auto y = kiln::models::apply_dropout(torch::ones({4096}), 0.25, /*training=*/true);
  const auto kept = y.ne(0).to(torch::kFloat32).mean().item<double>();
  expect(y.eq(0).logical_or(y.sub(1.0 / 0.75).abs().lt(1e-6)).all().item<bool>() && kept > 0.7 && kept < 0.8,
         "dropout");
  if (failures == 0) std::printf("header-only: cross_entropy, gelu, layer_norm and dropout match LibTorch\n");
  return failures == 0 ? 0 : 1;
}
