// Optimizer policies against LibTorch's own optimizers, and state that resumes exactly.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>
#include <kiln/optim/detail/adam_rule.hpp>  // the rule the fused loop tests run

#include <doctest/doctest.h>

namespace {

// hidden = 4000 gives a 40000-element weight: more than one thread chunk of the fused loops and
// above adam8bit's 4096-element threshold; the small layers exercise the scalar tails.
struct fixture {
  kiln::models::mlp model;
  kiln::data::tensor_pair data;
  explicit fixture(std::uint64_t seed, std::int64_t hidden = 24)
      : model((torch::manual_seed(seed), kiln::models::mlp_settings{.in_features = 10, .hidden = {hidden}, .classes = 3})),
        data(kiln::data::make_classification(48, 10, 3, seed)) {}
  torch::Tensor loss(int step) {
    auto x = data.inputs.slice(0, (step % 3) * 16, (step % 3) * 16 + 16);
    auto y = data.targets.slice(0, (step % 3) * 16, (step % 3) * 16 + 16);
    return torch::nn::functional::cross_entropy(model->forward(x), y);
  }
};

std::vector<std::pair<std::string, torch::Tensor>> named(torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// Largest |a - b| of a tensor relative to its largest |b|, over all parameters: fused kernels
// round differently from a chain of separate LibTorch ops (FMA, order), by about an ulp a step.
double max_relative_diff(torch::nn::Module& a, torch::nn::Module& b) {
  double diff = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    diff = std::max(diff, (pa[i] - pb[i]).abs().max().item<double>() / pb[i].abs().max().item<double>());
  return diff;
}

// Both optimizers see the same gradients (the reference model's): gradients computed from each
// model's own parameters would let an ulp of difference flip a ReLU near its kink and grow into a
// real divergence, which says nothing about the optimizers.
template <class Policy, class Reference>
void compare_for_100_steps(typename Policy::settings settings, Reference make_reference, std::int64_t hidden = 24) {
  fixture a(11, hidden), b(11, hidden);
  Policy policy(settings);
  policy.attach(named(*a.model));
  auto reference = make_reference(b.model->parameters());
  auto pa = a.model->parameters(), pb = b.model->parameters();
  for (int step = 0; step < 100; ++step) {
    reference.zero_grad();
    b.loss(step).backward();
    policy.zero_grad();
    for (std::size_t i = 0; i < pa.size(); ++i) pa[i].mutable_grad() = pb[i].grad().clone();
    policy.step();
    reference.step();
  }
  CHECK(max_relative_diff(*a.model, *b.model) <= 1e-6);
}

// Trains `policy` and a reference rule written with plain tensor ops side by side.
template <class Policy, class Rule>
double diff_from_reference(typename Policy::settings settings, Rule reference_step, int steps, std::int64_t hidden) {
  fixture a(13, hidden), b(13, hidden);
  Policy policy(settings);
  policy.attach(named(*a.model));
  auto params = b.model->parameters();
  for (int step = 1; step <= steps; ++step) {
    policy.zero_grad();
    a.loss(step).backward();
    policy.step();
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    b.loss(step).backward();
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) reference_step(i, params[i], params[i].grad(), step);
  }
  return max_relative_diff(*a.model, *b.model);
}

// The fused CPU loop and the tensor-op path (what runs on CUDA) over the same gradients, in
// fp32 or bf16 storage: they must agree bit for bit, parameters and state.
template <class Policy>
void check_tensor_path(typename Policy::settings settings, torch::ScalarType storage, bool kahan = false) {
  fixture a(17, 4000), b(17, 4000), source(17, 4000);  // source: fp32, computes the gradients
  auto pa = a.model->parameters(), pb = b.model->parameters(), ps = source.model->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    pa[i].set_data(pa[i].detach().to(storage));
    pb[i].set_data(pb[i].detach().to(storage));
  }
  Policy fused(settings), tensors(settings);
  fused.use_kahan_summation(kahan);
  tensors.use_kahan_summation(kahan);
  fused.attach(named(*a.model));
  tensors.attach(named(*b.model));
  tensors.use_tensor_ops(true);
  for (int step = 0; step < 5; ++step) {
    for (auto& p : ps) p.mutable_grad() = torch::Tensor();
    source.loss(step).backward();
    fused.zero_grad();
    tensors.zero_grad();
    for (std::size_t i = 0; i < pa.size(); ++i) {
      pa[i].mutable_grad() = ps[i].grad().to(storage);
      pb[i].mutable_grad() = ps[i].grad().to(storage);
    }
    fused.step();
    tensors.step();
  }
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CHECK(torch::equal(pa[i], pb[i]));
    CHECK(!torch::equal(pa[i], ps[i].to(storage)));  // the rule did run
  }
  kiln::state_dict state_a, state_b;
  fused.save_state(state_a, "");
  tensors.save_state(state_b, "");
  REQUIRE(state_a.size() == state_b.size());
  if (kahan) CHECK(state_a.count("layers.0.weight/compensation") == 1);
  for (const auto& [name, value] : state_a) CHECK_MESSAGE(torch::equal(value, state_b.at(name)), name);
}

// Trains k steps, saves the policy's state by name, loads it into a fresh policy over a copy of
// the model, and checks that both continue identically.
template <class Policy>
void check_resume(typename Policy::settings settings) {
  fixture a(21, 4000), b(21, 4000);
  Policy first(settings);
  first.attach(named(*a.model));
  for (int step = 0; step < 7; ++step) {
    first.zero_grad();
    a.loss(step).backward();
    first.step();
  }
  kiln::state_dict state;
  first.save_state(state, "optim/");
  CHECK(first.state_bytes() > 0);
  {
    torch::NoGradGuard no_grad;
    auto pa = a.model->parameters(), pb = b.model->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  Policy second(settings);
  second.attach(named(*b.model));
  second.load_state(state, "optim/");
  CHECK(second.state_bytes() == first.state_bytes());
  for (int step = 7; step < 20; ++step) {
    first.zero_grad();
    a.loss(step).backward();
    first.step();
    second.zero_grad();
    b.loss(step).backward();
    second.step();
  }
  CHECK(max_relative_diff(*a.model, *b.model) == 0.0);
}

}  // namespace

TEST_SUITE("optim") {
  TEST_CASE("adamw matches torch::optim::AdamW over 100 steps") {
    for (const bool amsgrad : {false, true})
      for (const std::int64_t hidden : {24, 4000}) {
        CAPTURE(amsgrad);
        CAPTURE(hidden);
        compare_for_100_steps<kiln::optim::adamw>(
            {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-7, .weight_decay = 0.1, .amsgrad = amsgrad},
            [&](std::vector<torch::Tensor> params) {
              return torch::optim::AdamW(
                  params,
                  torch::optim::AdamWOptions(3e-3).betas({0.8, 0.99}).eps(1e-7).weight_decay(0.1).amsgrad(amsgrad));
            },
            hidden);
      }
  }

  TEST_CASE("sgd matches torch::optim::SGD (momentum, nesterov, dampening, weight decay) over 100 steps") {
    compare_for_100_steps<kiln::optim::sgd>(
        {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true},
        [](std::vector<torch::Tensor> params) {
          return torch::optim::SGD(params, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3).nesterov(true));
        },
        4000);
    compare_for_100_steps<kiln::optim::sgd>(
        {.lr = 0.05, .momentum = 0.8, .dampening = 0.3},
        [](std::vector<torch::Tensor> params) {
          return torch::optim::SGD(params, torch::optim::SGDOptions(0.05).momentum(0.8).dampening(0.3));
        });
    compare_for_100_steps<kiln::optim::sgd>(
        {.lr = 0.05, .momentum = 0.0, .weight_decay = 1e-2},
        [](std::vector<torch::Tensor> params) {
          return torch::optim::SGD(params, torch::optim::SGDOptions(0.05).momentum(0.0).weight_decay(1e-2));
        });
  }

  TEST_CASE("lion matches the update of Chen et al. 2023 written with tensor ops") {
    const double lr = 1e-3, b1 = 0.9, b2 = 0.99, wd = 0.1;
    std::vector<torch::Tensor> momentum;
    auto reference = [&](std::size_t i, torch::Tensor& p, const torch::Tensor& g, int) {
      if (momentum.size() <= i) momentum.push_back(torch::zeros_like(p));
      auto c = b1 * momentum[i] + (1 - b1) * g;
      p.mul_(1 - lr * wd).sub_(lr * c.sign());
      momentum[i] = b2 * momentum[i] + (1 - b2) * g;
    };
    CHECK(diff_from_reference<kiln::optim::lion>({.lr = lr, .beta1 = b1, .beta2 = b2, .weight_decay = wd}, reference,
                                                 50, 4000) <= 1e-6);
  }

  // The paper's Algorithms 4 and 5 with sums (R = (G^2) 1, C = 1^T (G^2), V = R C / 1^T R)
  // where kiln uses PyTorch's means: the two are equal, the arithmetic is not shared.
  TEST_CASE("adafactor matches the paper's factored algorithm written with tensor ops") {
    const double lr = 1e-2, eps1 = 1e-30, eps2 = 1e-3, d = 1.0, wd = 0.01;
    std::vector<std::vector<torch::Tensor>> state;
    auto reference = [&](std::size_t i, torch::Tensor& p, const torch::Tensor& g, int t) {
      const double beta2 = 1.0 - std::pow(t, -0.8), rho = std::min(lr, 1.0 / std::sqrt(t));
      const double rms_p = std::sqrt(p.pow(2).mean().item<double>());
      const double alpha = std::max(eps2, rms_p) * rho;
      p.mul_(1 - lr * wd);
      torch::Tensor v;
      if (state.size() <= i) {
        if (p.dim() == 2) state.push_back({torch::zeros({p.size(0)}), torch::zeros({p.size(1)})});
        else state.push_back({torch::zeros_like(p)});
      }
      auto& s = state[i];
      if (p.dim() == 2) {
        auto g2 = g * g + eps1;
        s[0] = beta2 * s[0] + (1 - beta2) * g2.sum(1);
        s[1] = beta2 * s[1] + (1 - beta2) * g2.sum(0);
        v = torch::outer(s[0], s[1]) / s[0].sum();
      } else {
        s[0] = beta2 * s[0] + (1 - beta2) * (g * g + eps1);
        v = s[0];
      }
      auto u = g / v.sqrt();
      const double rms_u = std::sqrt(u.pow(2).mean().item<double>());
      p.sub_(alpha * u / std::max(1.0, rms_u / d));
    };
    CHECK(diff_from_reference<kiln::optim::adafactor>(
              {.lr = lr, .eps1 = eps1, .eps2 = eps2, .clip_threshold = d, .weight_decay = wd}, reference, 50, 300) <=
          1e-5);
    kiln::optim::adafactor opt({});
    fixture f(1, 300);
    opt.attach(named(*f.model));
    f.loss(0).backward();
    opt.step();
    // 10 x 300 weight: 10 + 300 floats of state, not 2 x 3000 as Adam's.
    std::int64_t expected = 0;
    for (auto& p : f.model->parameters()) expected += p.dim() == 2 ? p.size(0) + p.size(1) : p.numel();
    CHECK(opt.state_bytes() == 4 * expected);
  }

  TEST_CASE("adam8bit: the dynamic map, and quantization to the nearest code within its bound") {
    const auto& map = kiln::optim::detail::signed_map().values();
    const auto& umap = kiln::optim::detail::unsigned_map().values();
    CHECK(map.front() == doctest::Approx(-(1 - 0.9 / 128)));  // midpoint of the last of 64 steps in [0.1, 1]
    CHECK(map.back() == 1.0f);
    CHECK(umap.front() == 0.0f);
    CHECK(std::is_sorted(map.begin(), map.end()));
    CHECK(std::adjacent_find(umap.begin(), umap.end()) == umap.end());  // 256 distinct codes

    // encode starts its search from a table over a float's top 16 bits: it must give what a
    // binary search over the entries gives, for floats of every top-16-bits bucket (each at both
    // ends and in the middle), every entry and every midpoint between two entries.
    for (const auto* m : {&kiln::optim::detail::signed_map(), &kiln::optim::detail::unsigned_map()}) {
      const auto& v = m->values();
      auto binary_search = [&](float x) {
        const auto* hi = std::upper_bound(v.data(), v.data() + 256, x);
        if (hi == v.data()) return 0;
        if (hi == v.data() + 256) return 255;
        return static_cast<int>((x - hi[-1] <= *hi - x ? hi - 1 : hi) - v.data());
      };
      std::vector<float> probes(v.begin(), v.end());
      for (std::size_t k = 0; k + 1 < v.size(); ++k) probes.push_back((v[k] + v[k + 1]) / 2);
      for (std::uint32_t top = 0; top < 65536; ++top)
        for (const std::uint32_t low : {0x0000u, 0x8000u, 0xFFFFu}) {
          const std::uint32_t bits = top << 16 | low;
          float x;
          std::memcpy(&x, &bits, sizeof(x));
          probes.push_back(x);
        }
      std::int64_t mismatches = 0;
      for (const float x : probes) mismatches += m->encode(x) != binary_search(x);
      CHECK(mismatches == 0);
    }

    torch::manual_seed(3);
    auto x = torch::randn({5000}) * torch::rand({5000}).pow(4);  // magnitudes over decades
    auto [codes, absmax] = kiln::optim::detail::quantize_blockwise(x, 2048, kiln::optim::detail::signed_map());
    CHECK(absmax.numel() == 3);
    auto y = kiln::optim::detail::dequantize_blockwise(codes, absmax, 2048, kiln::optim::detail::signed_map());
    // Nearest code: no map entry is closer to x / absmax than the chosen one (brute force).
    auto table = torch::from_blob(const_cast<float*>(map.data()), {1, 256}, torch::kFloat32);
    auto scale = absmax.repeat_interleave(2048).slice(0, 0, 5000);
    auto normalized = (x / scale).unsqueeze(1);
    auto best = std::get<0>((normalized - table).abs().min(1));
    auto chosen = (normalized.squeeze(1) - (y / scale)).abs();
    CHECK((chosen - best).max().item<float>() <= 1e-6f);
    // Hence the bound: error <= absmax x half the widest gap of the map.
    auto gaps = (table.slice(1, 1, 256) - table.slice(1, 0, 255)).max().item<float>();
    CHECK(((x - y).abs() / scale).max().item<float>() <= gaps / 2 + 1e-6f);
  }

  TEST_CASE("adam8bit keeps 2 bytes per parameter and follows adamw closely") {
    fixture a(5, 4000), b(5, 4000);
    std::vector<torch::Tensor> initial;
    for (auto& p : b.model->parameters()) initial.push_back(p.detach().clone());
    kiln::optim::adam8bit q({.lr = 1e-3});
    kiln::optim::adamw full({.lr = 1e-3});
    q.attach(named(*a.model));
    full.attach(named(*b.model));
    for (int step = 0; step < 30; ++step) {
      q.zero_grad();
      a.loss(step).backward();
      q.step();
      full.zero_grad();
      b.loss(step).backward();
      full.step();
    }
    // The 40000-element weight is quantized: 2 bytes + 2 absmax floats per 2048; the small tensors
    // keep 8 bytes.
    std::int64_t expected = 0;
    for (auto& p : a.model->parameters())
      expected += p.numel() >= 4096 ? 2 * p.numel() + 2 * 4 * ((p.numel() + 2047) / 2048) : 8 * p.numel();
    CHECK(q.state_bytes() == expected);
    // What the 8-bit moments change is the path: compare the displacement from the start.
    auto pa = a.model->parameters(), pb = b.model->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) {
      auto full_move = pb[i] - initial[i], quantized_move = pa[i] - initial[i];
      const double deviation = ((quantized_move - full_move).norm() / full_move.norm()).item<double>();
      CAPTURE(i);
      CAPTURE(deviation);
      CHECK(deviation <= 0.15);
    }
  }

  TEST_CASE("no_decay patterns exempt parameters from weight decay by name") {
    fixture f(7);
    kiln::optim::adamw opt({.lr = 0.1, .weight_decay = 0.5, .no_decay = {"**bias"}});
    opt.attach(named(*f.model));
    std::vector<torch::Tensor> before;
    for (auto& p : f.model->parameters()) {
      before.push_back(p.detach().clone());
      p.mutable_grad() = torch::zeros_like(p);  // zero gradient: only the decay moves a parameter
    }
    opt.step();
    std::size_t i = 0;
    for (auto& item : f.model->named_parameters()) {
      CAPTURE(item.key());
      const bool bias = item.key().find("bias") != std::string::npos;
      auto expected = bias ? before[i] : before[i] * (1 - 0.1 * 0.5);
      CHECK(torch::allclose(item.value(), expected, 1e-6, 1e-7));
      ++i;
    }
  }

  TEST_CASE("bf16 parameters with fp32 state track the fp32 update") {
    fixture a(9, 300), b(9, 300);
    for (auto& p : a.model->parameters()) p.set_data(p.detach().to(torch::kBFloat16));
    kiln::optim::adamw low({.lr = 1e-2}), high({.lr = 1e-2});
    low.attach(named(*a.model));
    high.attach(named(*b.model));
    for (int step = 0; step < 10; ++step) {
      low.zero_grad();
      high.zero_grad();
      // Same fp32 gradients for both (bf16 gradients for the bf16 copy).
      b.loss(step).backward();
      auto pa = a.model->parameters(), pb = b.model->parameters();
      for (std::size_t i = 0; i < pa.size(); ++i) pa[i].mutable_grad() = pb[i].grad().to(torch::kBFloat16);
      low.step();
      high.step();
    }
    CHECK(low.state_bytes() == high.state_bytes());  // fp32 moments either way
    auto pa = a.model->parameters(), pb = b.model->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) {
      CHECK((pa[i].scalar_type() == torch::kBFloat16));
      CHECK((pa[i].to(torch::kFloat32) - pb[i]).abs().max().item<double>() <= 2e-2 * pb[i].abs().max().item<double>());
    }
  }

  TEST_CASE("fused loops: bf16 rounds as c10 does, and the AVX2 and baseline copies agree bit for bit") {
    namespace d = kiln::optim::detail;
    torch::manual_seed(4);
    const std::int64_t n = 1003;  // whole vectors of 4 and of 8, and a tail
    // bf16 storage: load, an fp32 rule, store rounded to nearest even must equal the same
    // arithmetic in fp32 tensor ops followed by LibTorch's conversion; a NaN becomes c10's NaN
    // (LibTorch's own vectorised conversion writes 0xFFFF instead, its scalar one 0x7FC0).
    auto p = torch::randn({n}).to(torch::kBFloat16);
    p[5] = std::numeric_limits<float>::quiet_NaN();
    auto g = torch::randn({n}).to(torch::kBFloat16);
    auto expected = (p.to(torch::kFloat32) * 0.75f + g.to(torch::kFloat32) * 0.3f).to(torch::kBFloat16);
    d::fused_loop(n, [](auto& p, const auto& g) { p = p * 0.75f + g * 0.3f; }, p.data_ptr<c10::BFloat16>(),
                  /*compensation=*/nullptr, g.data_ptr<c10::BFloat16>());
    auto finite = expected.isfinite();
    CHECK(torch::equal(p.view(torch::kInt16).masked_select(finite), expected.view(torch::kInt16).masked_select(finite)));
    CHECK(p.data_ptr<c10::BFloat16>()[5].x == c10::BFloat16(std::numeric_limits<float>::quiet_NaN()).x);
#ifdef KILN_GCC_X86
    if (!d::cpu_has_avx2()) {
      MESSAGE("this CPU has no AVX2: only the baseline loop runs here");
      return;
    }
    const d::adam_rule rule(1e-3, 0.1, 0.9, 0.999, 1e-8, 3.0);
    auto base = std::vector<torch::Tensor>{torch::randn({n}), torch::randn({n}) * 1e-2, torch::randn({n}) * 1e-3,
                                           torch::rand({n}) * 1e-5};
    std::vector<torch::Tensor> narrow, wide;
    for (auto& t : base) narrow.push_back(t.clone()), wide.push_back(t.clone());
    d::fused_range<4, false>(0, n, rule, narrow[0].data_ptr<float>(), nullptr, narrow[1].data_ptr<float>(),
                             narrow[2].data_ptr<float>(), narrow[3].data_ptr<float>());
    d::fused_range_avx2<false>(0, n, rule, wide[0].data_ptr<float>(), nullptr, wide[1].data_ptr<float>(),
                               wide[2].data_ptr<float>(), wide[3].data_ptr<float>());
    for (std::size_t i = 0; i < base.size(); ++i) CHECK(torch::equal(narrow[i], wide[i]));
    CHECK(!torch::equal(narrow[0], base[0]));  // the rule did run
    // The same for bf16 parameters with Kahan compensation: parameter and compensation agree too.
    auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
    std::vector<torch::Tensor> narrow_b{bf16(base[0]), bf16(base[1]), bf16(base[0] * 1e-3), base[2].clone(),
                                        base[3].clone()};
    std::vector<torch::Tensor> wide_b;
    for (auto& t : narrow_b) wide_b.push_back(t.clone());
    auto run = [&](std::vector<torch::Tensor>& t, auto&& range) {
      range(t[0].data_ptr<c10::BFloat16>(), t[2].data_ptr<c10::BFloat16>(), t[1].data_ptr<c10::BFloat16>(),
            t[3].data_ptr<float>(), t[4].data_ptr<float>());
    };
    run(narrow_b, [&](auto... ptr) { d::fused_range<4, true>(0, n, rule, ptr...); });
    run(wide_b, [&](auto... ptr) { d::fused_range_avx2<true>(0, n, rule, ptr...); });
    for (std::size_t i = 0; i < narrow_b.size(); ++i) CHECK(torch::equal(narrow_b[i], wide_b[i]));
    CHECK(!torch::equal(narrow_b[2], bf16(base[0] * 1e-3)));  // the compensation did change
#endif
  }

  TEST_CASE("the tensor-op path (CUDA's) equals the fused CPU loop bit for bit, fp32 and bf16") {
    for (const auto storage : {torch::kFloat32, torch::kBFloat16}) {
      CAPTURE(storage);
      check_tensor_path<kiln::optim::adamw>({.lr = 1e-2, .weight_decay = 0.1}, storage);
      check_tensor_path<kiln::optim::adamw>({.lr = 1e-2, .amsgrad = true}, storage);
      check_tensor_path<kiln::optim::sgd>({.lr = 0.05, .momentum = 0}, storage);
      check_tensor_path<kiln::optim::sgd>({.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true}, storage);
      check_tensor_path<kiln::optim::sgd>({.lr = 0.05, .momentum = 0.9, .dampening = 0.1}, storage);
      check_tensor_path<kiln::optim::lion>({.lr = 1e-3, .weight_decay = 0.1}, storage);
    }
    // bf16 with Kahan summation: parameters and compensation buffers, bit for bit
    check_tensor_path<kiln::optim::adamw>({.lr = 1e-2, .weight_decay = 0.1}, torch::kBFloat16, /*kahan=*/true);
    check_tensor_path<kiln::optim::sgd>({.lr = 0.05, .momentum = 0.9}, torch::kBFloat16, /*kahan=*/true);
    check_tensor_path<kiln::optim::lion>({.lr = 1e-3}, torch::kBFloat16, /*kahan=*/true);
  }

  TEST_CASE("Kahan summation keeps bf16 updates that plain bf16 rounds away") {
    // SGD with a constant gradient of 1 and lr 1e-4 moves every weight by -1e-4 a step: far below
    // half a bf16 ulp of weights in [1, 2) (2^-8 = 0.0039), so plain bf16 never moves them. After
    // 1000 steps the fp32 answer is start - 0.1; with Kahan summation the bf16 weight must be that
    // rounded to bf16 (within one ulp, 2^-7 below 2 and 2^-8 below 1). Weight + compensation is
    // off by what storing the compensation in bf16 rounds away: at most 2^-9 of it, itself at most
    // half an ulp (2^-8), per step: 1000 x 2^-17 in all (measured: about a third of that).
    const std::int64_t n = 1003;  // vectors of 4 and 8, and a scalar tail
    const auto start = (1.0 + torch::rand({n})).to(torch::kBFloat16);
    auto run = [&](bool kahan) {
      auto param = start.clone();
      param.mutable_grad() = torch::ones_like(param);
      kiln::optim::sgd sgd({.lr = 1e-4, .momentum = 0.0});
      sgd.use_kahan_summation(kahan);
      sgd.attach({{"w", param}});
      for (int i = 0; i < 1000; ++i) sgd.step();
      kiln::state_dict state;
      sgd.save_state(state, "");
      return std::make_pair(param, kahan ? state.at("w/compensation") : torch::Tensor());
    };
    const auto expected = start.to(torch::kFloat64) - 1000 * 1e-4;
    const auto [plain, none] = run(false);
    CHECK(torch::equal(plain, start));  // every update rounded away
    const auto [kahan, compensation] = run(true);
    REQUIRE(compensation.defined());
    CHECK(((kahan.to(torch::kFloat64) - expected).abs() <= 0.0078125).all().item<bool>());
    const auto sum_error = (kahan.to(torch::kFloat64) + compensation.to(torch::kFloat64) - expected).abs().max();
    MESSAGE("largest |weight + compensation - exact| after 1000 steps: " << sum_error.item<double>());
    CHECK(sum_error.item<double>() <= 1000 * std::ldexp(1.0, -17));
    // fp32 parameters have no compensation buffer: Kahan summation is for bf16 storage only
    kiln::optim::sgd fp32({.lr = 1e-4});
    fp32.use_kahan_summation(true);
    fp32.attach({{"w", torch::ones({4})}});
    CHECK(fp32.state_bytes() == 0);
  }

  TEST_CASE("optimizer state saved by parameter name resumes identically") {
    check_resume<kiln::optim::adamw>({.lr = 1e-2, .amsgrad = true});
    check_resume<kiln::optim::sgd>({.lr = 0.05, .momentum = 0.9});
    check_resume<kiln::optim::lion>({.lr = 1e-3});
    check_resume<kiln::optim::adafactor>({.beta1 = 0.9});
    check_resume<kiln::optim::adam8bit>({.lr = 1e-2});
  }

  TEST_CASE("state of the wrong shape is refused with the parameter's name") {
    fixture a(3);
    kiln::optim::adamw opt({});
    opt.attach(named(*a.model));
    kiln::state_dict state;
    state["optim/layers.0.weight/step"] = kiln::scalar_tensor(std::int64_t{3});
    state["optim/layers.0.weight/exp_avg"] = torch::zeros({2, 2});
    state["optim/layers.0.weight/exp_avg_sq"] = torch::zeros({2, 2});
    CHECK_THROWS_WITH_AS(opt.load_state(state, "optim/"), doctest::Contains("optim/layers.0.weight/exp_avg"),
                         kiln::state_error);
  }

  TEST_CASE("a parameter the fused optimizers cannot update is named") {
    auto w = torch::zeros({3, 3}, torch::kFloat64).requires_grad_();
    kiln::optim::adamw opt({});
    CHECK_THROWS_WITH_AS(opt.attach({{"head.weight", w}}), doctest::Contains("\"head.weight\" is Double"),
                         kiln::config_error);
  }
}
