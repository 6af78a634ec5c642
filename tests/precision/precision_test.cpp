// Precision policies: the loss scaler against a hand-computed scale sequence, a planted Inf
// that skips exactly one step, bf16 autocast dtypes, bf16 and bf16-pure accuracy against fp32 on
// Fashion-MNIST, and master weights (or Kahan summation) that keep updates bf16 would round away.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <iterator>
#include <limits>

namespace {

// fp32 compute with GradScaler-style loss scaling: the scaler's path through the accelerator,
// testable on a CPU where fp16 autocast does not exist.
struct scaled_fp32 {
  using axis = kiln::axis::precision;
  static constexpr std::string_view kind = "scaled-fp32";
  struct settings : kiln::loss_scaler_settings {};
  explicit scaled_fp32(const settings& s) : scaler(s) {}
  kiln::precision::fp32::scope autocast() const { return {}; }
  torch::Tensor scale(const torch::Tensor& loss) const { return scaler.scale(loss); }
  bool unscale_and_check(std::vector<torch::Tensor>& p) { return scaler.unscale_and_check(p); }
  void update(bool finite) { scaler.update(finite); }
  kiln::loss_scaler scaler;
};

// A sharding policy that, like local SGD's average, changes the weights after optimizer steps:
// it halves them.
struct halving_sharding : kiln::sharding::single {
  static constexpr std::string_view kind = "halving";
  using single::single;
  void after_optimizer_step(std::int64_t, std::int64_t, const std::vector<torch::Tensor>& weights) {
    torch::NoGradGuard no_grad;
    for (auto w : weights) w.mul_(0.5);
  }
};

kiln::models::mlp small_mlp() {
  torch::manual_seed(0);
  return kiln::models::mlp(kiln::models::mlp_settings{.in_features = 8, .hidden = {16}, .classes = 3});
}

}  // namespace

TEST_SUITE("precision") {
  TEST_CASE("loss scaler: the scale sequence of a scripted series of finite and non-finite steps") {
    kiln::loss_scaler scaler({.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
    const std::vector<bool> finite = {true, true, true, true, false, true, true, true, false, false, true};
    // hand-computed: grow after 3 finite in a row, halve on each overflow (and restart the count)
    const std::vector<double> expected = {1024, 1024, 2048, 2048, 1024, 1024, 1024, 2048, 1024, 512, 512};
    for (std::size_t i = 0; i < finite.size(); ++i) {
      scaler.update(finite[i]);
      CHECK_MESSAGE(scaler.scale() == expected[i], "after step " << i);
    }
    kiln::loss_scaler defaults;
    CHECK(defaults.scale() == 65536.0);
    for (int i = 0; i < 1999; ++i) defaults.update(true);
    CHECK(defaults.scale() == 65536.0);
    defaults.update(true);
    CHECK(defaults.scale() == 131072.0);

    kiln::state_dict state;
    scaler.save_state(state, "p/");
    kiln::loss_scaler restored;
    restored.load_state(state, "p/");
    CHECK(restored.scale() == scaler.scale());
    CHECK(restored.growth_tracker() == scaler.growth_tracker());
  }

  TEST_CASE("a planted Inf gradient skips exactly that optimizer step and halves the scale") {
    auto model = small_mlp();
    auto data = kiln::data::make_classification(32, 8, 3, 1);
    kiln::accelerator<scaled_fp32, kiln::optim::sgd> acc({.precision = {{.init_scale = 256}},
                                                          .optimizer = {.lr = 0.1, .momentum = 0.0}});
    acc.prepare(model);
    auto loss = [&] { return torch::nn::functional::cross_entropy(model->forward(data.inputs), data.targets); };

    // step 1: finite; the update equals plain SGD on the unscaled gradient
    auto before = model->layers[0]->as<torch::nn::Linear>()->weight.detach().clone();
    acc.backward(loss());
    auto r1 = acc.step();
    CHECK(r1.stepped);
    CHECK(acc.precision().scaler.scale() == 256);

    // step 2: an Inf planted in one gradient
    auto snapshot = model->layers[0]->as<torch::nn::Linear>()->weight.detach().clone();
    acc.backward(loss());
    model->layers[2]->as<torch::nn::Linear>()->weight.mutable_grad().index_put_({0, 0}, INFINITY);
    auto r2 = acc.step();
    CHECK(r2.skipped);
    CHECK_FALSE(r2.stepped);
    CHECK(acc.precision().scaler.scale() == 128);
    CHECK(torch::equal(model->layers[0]->as<torch::nn::Linear>()->weight, snapshot));  // no update
    CHECK_FALSE(torch::equal(snapshot, before));                                     // step 1 did update

    // step 3: finite again, steps
    acc.backward(loss());
    CHECK(acc.step().stepped);
    CHECK(acc.optimizer_steps() == 3);
  }

  TEST_CASE("unscaled gradients equal the unscaled-loss gradients") {
    auto a = small_mlp(), b = small_mlp();
    auto data = kiln::data::make_classification(32, 8, 3, 2);
    scaled_fp32 policy({{.init_scale = 1024}});
    auto la = torch::nn::functional::cross_entropy(a->forward(data.inputs), data.targets);
    policy.scale(la).backward();
    auto params = a->parameters();
    CHECK(policy.unscale_and_check(params));
    torch::nn::functional::cross_entropy(b->forward(data.inputs), data.targets).backward();
    for (std::size_t i = 0; i < params.size(); ++i)
      CHECK((params[i].grad() - b->parameters()[i].grad()).abs().max().item<double>() <= 1e-7);
  }

  TEST_CASE("fp16 on the CPU trains where CPU autocast has float16, and is refused with LibTorch's reason where not") {
    using fp16_accelerator = kiln::accelerator<kiln::precision::fp16, kiln::optim::adamw>;
    const std::string why = kiln::detail::cpu_half_autocast_failure();
    if (!why.empty()) {
      // LibTorch 1.13 (Debian's, CI's): its CPU autocast takes only bfloat16
      MESSAGE("CPU float16 autocast unavailable: " << why);
      auto start = [] { fp16_accelerator acc({.device = "cpu"}); };
      CHECK_THROWS_WITH_AS(start(), doctest::Contains("cannot train on the CPU"), kiln::config_error);
      CHECK_THROWS_WITH_AS(start(), doctest::Contains(why.c_str()), kiln::config_error);
      CHECK_THROWS_WITH_AS(start(), doctest::Contains("kind = \"bf16\""), kiln::config_error);
      // the refusal leaves no autocast state behind
      CHECK_FALSE(kiln::detail::autocast_enabled(c10::DeviceType::CPU));
      return;
    }
    // PyTorch 2.x: matmuls run in float16, the loss in fp32, parameters and gradients stay fp32,
    // and the loss falls with the scale at its initial 2^16 (nothing overflowed)
    auto model = small_mlp();
    fp16_accelerator acc({.optimizer = {.lr = 1e-2}, .device = "cpu"});
    acc.prepare(model);
    auto data = kiln::data::make_classification(64, 8, 3, 5);
    auto loss_now = [&] {
      auto cast = acc.autocast();
      return torch::nn::functional::cross_entropy(model->forward(data.inputs), data.targets);
    };
    {
      auto cast = acc.autocast();
      CHECK((model->forward(data.inputs).scalar_type() == torch::kHalf));
    }
    const double first = loss_now().item<double>();
    for (int i = 0; i < 20; ++i) {
      auto loss = loss_now();
      CHECK((loss.scalar_type() == torch::kFloat32));
      acc.backward(loss);
      CHECK(acc.step().stepped);
    }
    for (const auto& p : model->parameters()) CHECK((p.grad().scalar_type() == torch::kFloat32));
    CHECK(acc.precision().scaler().scale() == 65536.0);
    CHECK(loss_now().item<double>() < first);
  }

  TEST_CASE("under bf16 autocast matmul outputs are bf16, the loss fp32, parameters fp32") {
    auto model = small_mlp();
    kiln::accelerator<kiln::precision::bf16> acc;
    acc.prepare(model);
    auto data = kiln::data::make_classification(16, 8, 3, 3);
    torch::Tensor logits, loss;
    {
      auto cast = acc.autocast();
      logits = model->forward(data.inputs);
      loss = torch::nn::functional::cross_entropy(logits, data.targets);
    }
    CHECK((logits.scalar_type() == torch::kBFloat16));
    CHECK((loss.scalar_type() == torch::kFloat32));
    for (const auto& p : model->parameters()) CHECK((p.scalar_type() == torch::kFloat32));
    // the scope ends cleanly: no autocast outside it
    CHECK((model->forward(data.inputs).scalar_type() == torch::kFloat32));
    acc.backward(loss);
    for (const auto& p : model->parameters()) CHECK((p.grad().scalar_type() == torch::kFloat32));
  }

  TEST_CASE("bf16 matmuls on the CPU: fp32 compute from bf16 operands where LibTorch has no fast bf16 GEMM, by setting anywhere") {
    namespace pd = kiln::precision::detail;
    torch::manual_seed(0);
    const auto a = torch::randn({64, 96}).to(torch::kBFloat16), b = torch::randn({96, 48}).to(torch::kBFloat16);
    const auto c = torch::randn({48}).to(torch::kBFloat16);
    // The reference: LibTorch's fp32 product of the same bf16 operands, rounded once.
    const auto exact = torch::mm(a.to(torch::kFloat), b.to(torch::kFloat)).to(torch::kBFloat16);
    const auto calls = [] { return pd::fp32_cpu_matmul_calls().load(); };
    using mode = kiln::precision::matmul_mode;
    auto replaced = [&](mode setting) {
      kiln::precision::bf16::settings s;
      s.cpu_matmul = setting;
      kiln::precision::bf16 policy(s);
      const auto before = calls();
      const auto product = torch::mm(a, b);
      return std::pair{calls() > before, torch::equal(product, exact)};
    };
    {
      const auto [used, equal] = replaced(mode::fp32);
      CHECK(used);
      CHECK(equal);
    }
    // "auto" replaces exactly where this CPU lacks oneDNN's bf16 GEMM (AVX-512 BW/VL/DQ).
    CHECK(replaced(mode::automatic).first == !pd::cpu_has_onednn_bf16_gemm());
    CHECK_FALSE(replaced(mode::bf16).first);
    // Gone with the policy: LibTorch's kernel again.
    const auto before = calls();
    torch::mm(a, b);
    CHECK(calls() == before);

    // addmm, bmm and baddbmm, and the backward of a linear layer under autocast: fp32 operands
    // rounded to bf16 are LibTorch's fp32 op's product rounded once.
    kiln::precision::bf16::settings fp32_matmuls;
    fp32_matmuls.cpu_matmul = kiln::precision::matmul_mode::fp32;
    kiln::precision::bf16 policy(fp32_matmuls);
    const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
    CHECK(torch::equal(torch::addmm(c, a, b), torch::addmm(f(c), f(a), f(b)).to(torch::kBFloat16)));
    const auto ba = torch::randn({3, 8, 16}).to(torch::kBFloat16), bb = torch::randn({3, 16, 4}).to(torch::kBFloat16);
    const auto bc = torch::randn({3, 8, 4}).to(torch::kBFloat16);
    CHECK(torch::equal(torch::bmm(ba, bb), torch::bmm(f(ba), f(bb)).to(torch::kBFloat16)));
    CHECK(torch::equal(torch::baddbmm(bc, ba, bb), torch::baddbmm(f(bc), f(ba), f(bb)).to(torch::kBFloat16)));
    // fp32 operands are LibTorch's own kernel's, untouched.
    CHECK(torch::equal(torch::mm(f(a), f(b)), at::cpu::mm(f(a), f(b))));

    auto weight = torch::randn({48, 96}, torch::requires_grad());
    const auto x = torch::randn({64, 96});
    torch::Tensor y;
    {
      auto cast = policy.autocast();
      y = torch::linear(x, weight);
    }
    CHECK((y.scalar_type() == torch::kBFloat16));
    const auto before_backward = calls();
    y.to(torch::kFloat).sum().backward();
    CHECK(calls() == before_backward + 1);  // the weight's gradient; the input needs none
    // d(sum y)/dW = ones^T x, from x rounded to bf16 as autocast feeds it: the fp32 sum of 64
    // terms rounded once (either operand order: at most one bf16 step apart). LibTorch's 1.13
    // kernel, summing in bf16, is further off than that.
    const auto expected = torch::mm(torch::ones({48, 64}), f(x.to(torch::kBFloat16))).to(torch::kBFloat16);
    CHECK(torch::allclose(weight.grad(), expected.to(torch::kFloat), /*rtol=*/1.0 / 128, /*atol=*/0));
  }

  TEST_CASE("kiln's fp32 <-> bf16 / fp16 conversion is LibTorch's, bit for bit, at every vector width and in any dense layout") {
    namespace pd = kiln::precision::detail;
    torch::manual_seed(3);
    // Ordinary values across fp32's range, bf16/fp16 ties, subnormals, overflow, infinities, NaN.
    auto x = torch::randn({1031}) * torch::pow(2.0, torch::randint(-30, 30, {1031}).to(torch::kFloat));
    const float specials[] = {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-9f, 1.0f + 0x1p-11f, 0x1p-130f,
                              -0x1p-140f, 0x1p-20f, 70000.0f, -1e30f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
    for (std::size_t i = 0; i < std::size(specials); ++i) x[static_cast<std::int64_t>(i)] = specials[i];
    // Bit for bit, except that a NaN only has to stay NaN: LibTorch 1.13 itself narrows NaN to
    // 0x7FC0 in c10::BFloat16 and to 0xFFFF in its AVX2 copy.
    const auto bits = [](const torch::Tensor& t) {
      const auto nan = torch::isnan(t);
      const auto raw = t.element_size() == 2 ? t.view(torch::kInt16).to(torch::kInt32) : t.view(torch::kInt32);
      return torch::where(nan, torch::full_like(raw, -1), raw);
    };
    for (const auto narrow : {torch::kBFloat16, torch::kHalf}) {
      CAPTURE(narrow);
      const auto reference = x.to(narrow);
      const auto back = reference.to(torch::kFloat);
      // Each vector width the kernel is built with, on the same data (lengths not a multiple of it).
      auto with_width = [&](int width, const torch::Tensor& from, torch::ScalarType to) {
        auto out = torch::empty_like(from, from.options().dtype(to));
        kiln::detail::with_lane_storage(from.scalar_type(), [&]<class F>(std::type_identity<F>) {
          kiln::detail::with_lane_storage(to, [&]<class T>(std::type_identity<T>) {
            if (width == 4) pd::convert_range<4>(from.data_ptr<F>(), out.data_ptr<T>(), 0, from.numel());
#ifdef KILN_GCC_X86
            else if (kiln::detail::cpu_has_avx2()) pd::convert_avx2(from.data_ptr<F>(), out.data_ptr<T>(), 0, from.numel());
#endif
            else pd::convert_range<8>(from.data_ptr<F>(), out.data_ptr<T>(), 0, from.numel());
          });
        });
        return out;
      };
      for (const int width : {4, 8}) {
        CAPTURE(width);
        CHECK(torch::equal(bits(with_width(width, x, narrow)), bits(reference)));
        CHECK(torch::equal(bits(with_width(width, reference, torch::kFloat)), bits(back)));
      }
      CHECK(torch::equal(bits(pd::convert_cpu(x, narrow)), bits(reference)));
      CHECK(torch::equal(bits(pd::convert_cpu(reference, torch::kFloat)), bits(back)));
    }
    // A transpose keeps its strides (no copy to contiguous first); a strided slice goes to LibTorch.
    const auto m = torch::randn({37, 53});
    const auto t = pd::convert_cpu(m.t(), torch::kBFloat16);
    CHECK((t.strides() == m.t().strides()));
    CHECK(torch::equal(t, m.t().to(torch::kBFloat16)));
    const auto every_other = m.slice(1, 0, 53, 2);
    CHECK_FALSE(pd::fast_conversion_applies(every_other, torch::kBFloat16));
    CHECK(torch::equal(pd::convert_cpu(every_other, torch::kBFloat16), every_other.to(torch::kBFloat16)));
  }

  TEST_CASE("bf16 keeps half of fp32's activation memory with its matmuls computed in fp32") {
    // What forward keeps for backward, by kiln's meter, in an MLP under fp32 and under bf16 with
    // the fp32-computed matmuls (\"fp32\", so the same on every CPU): the bound is 0.7x.
    torch::manual_seed(0);
    // Batch and widths where activations, not autocast's bf16 copies of the weights, dominate.
    kiln::models::mlp model(
        kiln::models::mlp_settings{.in_features = 64, .hidden = {512, 512, 512}, .classes = 10, .dropout = 0.0});
    const auto x = torch::randn({4096, 64});
    auto kept_by_forward = [&](auto&& policy) {
      kiln::memory_meter meter;
      meter.start();
      const auto base = meter.current();
      torch::Tensor loss;
      {
        auto cast = policy.autocast();
        loss = model->forward(x).to(torch::kFloat).sum();
      }
      const auto kept = meter.current() - base;
      loss.backward();
      meter.stop();
      return static_cast<double>(kept);
    };
    kiln::precision::bf16::settings s;
    s.cpu_matmul = kiln::precision::matmul_mode::fp32;
    const double full = kept_by_forward(kiln::precision::fp32{}), half = kept_by_forward(kiln::precision::bf16(s));
    MESSAGE("activations kept by forward: fp32 ", full, " bytes, bf16 ", half, " (", half / full, "x)");
    CHECK(half <= 0.7 * full);
  }

  TEST_CASE("bf16-pure: bf16 parameters and activations, fp32 masters in the optimizer") {
    auto model = small_mlp();
    kiln::accelerator<kiln::precision::bf16_pure, kiln::optim::adamw> acc;
    acc.prepare(model);
    for (const auto& p : model->parameters()) CHECK((p.scalar_type() == torch::kBFloat16));
    for (const auto& p : acc.parameters()) CHECK((p.scalar_type() == torch::kFloat32));
    auto data = kiln::data::make_classification(16, 8, 3, 3);
    torch::Tensor logits, loss;
    {
      auto cast = acc.autocast();
      logits = model->forward(data.inputs);
      loss = torch::nn::functional::cross_entropy(logits, data.targets);
    }
    CHECK((logits.scalar_type() == torch::kBFloat16));
    CHECK((loss.scalar_type() == torch::kFloat32));
    acc.backward(loss);
    CHECK(acc.step().stepped);
    // the model holds the masters rounded to bf16
    for (std::size_t i = 0; i < acc.parameters().size(); ++i)
      CHECK(torch::equal(model->parameters()[i], acc.parameters()[i].to(torch::kBFloat16)));
  }

  TEST_CASE("bf16-pure with kahan: bf16 weights updated in place through a compensation buffer, resumed exactly") {
    auto data = kiln::data::make_classification(16, 8, 3, 3);
    using acc_t = kiln::accelerator<kiln::precision::bf16_pure, kiln::optim::adamw>;
    auto train = [&](acc_t& acc, kiln::models::mlp& model, int steps) {
      for (int i = 0; i < steps; ++i) {
        torch::Tensor loss;
        {
          auto cast = acc.autocast();
          loss = torch::nn::functional::cross_entropy(model->forward(data.inputs), data.targets);
        }
        acc.backward(loss);
        CHECK(acc.step().stepped);
      }
    };
    auto model = small_mlp();
    acc_t acc({.precision = {.kahan = true}, .optimizer = {.lr = 1e-3}});
    acc.prepare(model);
    std::int64_t numel = 0;
    for (std::size_t i = 0; i < acc.parameters().size(); ++i) {
      CHECK((model->parameters()[i].scalar_type() == torch::kBFloat16));
      CHECK(acc.parameters()[i].is_same(model->parameters()[i]));  // no masters: the optimizer updates the model
      numel += model->parameters()[i].numel();
    }
    CHECK(acc.optimizer().state_bytes() == 2 * numel);  // the compensation buffers, before any step
    train(acc, model, 3);
    CHECK(acc.optimizer().state_bytes() == (8 + 2) * numel);  // AdamW's moments and the compensation
    for (const auto& p : model->parameters()) CHECK((p.grad().scalar_type() == torch::kBFloat16));

    // Resume: a second model and accelerator load the weights and the state, and both go on alike.
    kiln::state_dict state;
    acc.save_state(state);
    CHECK(state.count("optim/layers.0.weight/compensation") == 1);
    CHECK(state.count("precision/master/layers.0.weight") == 0);
    auto copy = small_mlp();
    acc_t resumed({.precision = {.kahan = true}, .optimizer = {.lr = 1e-3}});
    resumed.prepare(copy);
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < model->parameters().size(); ++i) copy->parameters()[i].copy_(model->parameters()[i]);
    }
    resumed.load_state(state);
    train(acc, model, 4);
    train(resumed, copy, 4);
    for (std::size_t i = 0; i < model->parameters().size(); ++i)
      CHECK(torch::equal(model->parameters()[i], copy->parameters()[i]));

    // A state saved with fp32 masters does not resume a Kahan run as if it were one.
    kiln::accelerator<kiln::precision::bf16_pure, kiln::optim::adamw> masters;
    auto other = small_mlp();
    masters.prepare(other);
    kiln::state_dict master_state;
    masters.save_state(master_state);
    CHECK_THROWS_WITH_AS(resumed.load_state(master_state),
                         doctest::Contains("no entry \"optim/layers.0.weight/compensation\": it was saved without Kahan summation"),
                         kiln::state_error);
    CHECK_THROWS_WITH_AS(masters.load_state(state),
                         doctest::Contains("no entry \"precision/master/layers.0.weight\": it was saved without fp32 master weights"),
                         kiln::state_error);
  }

  TEST_CASE("bf16-pure: what sharding does to the weights after a step (local SGD's average) reaches masters and model") {
    // Two steps without gradients: the optimizer changes nothing, the sharding policy halves the
    // weights twice. Were the model's bf16 weights changed instead of the masters, the next step
    // would round the unchanged masters back into the model (a local-SGD average undone).
    for (const bool kahan : {false, true}) {
      CAPTURE(kahan);
      auto model = small_mlp();
      const auto start = model->layers[0]->as<torch::nn::Linear>()->weight.detach().clone();
      kiln::accelerator<kiln::precision::bf16_pure, halving_sharding, kiln::optim::sgd> acc(
          {.precision = {.kahan = kahan}});
      acc.prepare(model);
      acc.step();
      acc.step();
      CHECK(torch::equal(model->layers[0]->as<torch::nn::Linear>()->weight, start.to(torch::kBFloat16) / 4));
      CHECK(torch::equal(acc.parameters()[0], kahan ? start.to(torch::kBFloat16) / 4 : start / 4));
    }
  }

  TEST_CASE("bf16-pure makes progress at a learning rate where bf16 updates round to zero") {
    auto data = kiln::data::make_classification(256, 8, 3, 4);
    auto loss_of = [&](kiln::models::mlp& m) {
      return torch::nn::functional::cross_entropy(m->forward(data.inputs.to(torch::kBFloat16)), data.targets);
    };
    const double lr = 1e-4;  // |lr * grad| is far below half a bf16 ulp of the weights
    // plain bf16: SGD straight on bf16 parameters
    auto plain = small_mlp();
    plain->to(torch::kBFloat16);
    auto start = plain->layers[0]->as<torch::nn::Linear>()->weight.detach().clone();
    torch::optim::SGD sgd(plain->parameters(), torch::optim::SGDOptions(lr));
    for (int i = 0; i < 50; ++i) {
      sgd.zero_grad();
      loss_of(plain).backward();
      sgd.step();
    }
    CHECK(torch::equal(plain->layers[0]->as<torch::nn::Linear>()->weight, start));  // nothing moved

    // bf16-pure: the same updates accumulate in the fp32 masters
    auto pure = small_mlp();
    kiln::accelerator<kiln::precision::bf16_pure, kiln::optim::sgd> acc({.optimizer = {.lr = lr, .momentum = 0.0}});
    acc.prepare(pure);
    const double first = loss_of(pure).item<double>();
    const auto master_start = acc.parameters()[0].detach().clone();
    for (int i = 0; i < 2000; ++i) {
      acc.backward(loss_of(pure));
      acc.step();
    }
    CHECK((acc.parameters()[0] - master_start).abs().max().item<double>() > 0);
    CHECK_FALSE(torch::equal(pure->layers[0]->as<torch::nn::Linear>()->weight, start));
    CHECK(loss_of(pure).item<double>() < first);

    // kahan = true: the same updates accumulate in the compensation buffers until they move the
    // bf16 weights, which end near the fp32 masters' weights.
    auto kahan = small_mlp();
    kiln::accelerator<kiln::precision::bf16_pure, kiln::optim::sgd> kahan_acc(
        {.precision = {.kahan = true}, .optimizer = {.lr = lr, .momentum = 0.0}});
    kahan_acc.prepare(kahan);
    for (int i = 0; i < 2000; ++i) {
      kahan_acc.backward(loss_of(kahan));
      kahan_acc.step();
    }
    const auto& kahan_weight = kahan->layers[0]->as<torch::nn::Linear>()->weight;
    const auto& master_weight = acc.parameters()[0];
    CHECK_FALSE(torch::equal(kahan_weight, start));
    CHECK(loss_of(kahan).item<double>() < first);
    const double moved = (master_weight - master_start).abs().max().item<double>();
    const double apart = (kahan_weight.to(torch::kFloat32) - master_weight).abs().max().item<double>();
    MESSAGE("largest master move " << moved << ", largest |kahan - master| " << apart);
    CHECK(apart < moved / 2);
  }

  TEST_CASE("bf16 and bf16-pure reach fp32's Fashion-MNIST accuracy within 0.5 points") {
    const std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
    if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz")) return;
    auto train = kiln::data::load_fashion_mnist(dir, kiln::data::split::train);
    auto test = kiln::data::load_fashion_mnist(dir, kiln::data::split::test);
    auto accuracy = [&]<class Precision>(Precision*, typename Precision::settings precision = {}) {
      using trainer_t = kiln::trainer<Precision, kiln::optim::adamw>;
      torch::manual_seed(0);
      kiln::models::mlp model(kiln::models::mlp_settings{.hidden = {256, 256}, .dropout = 0.1});
      kiln::data::batch_loader loader(train, {.batch_size = 128, .seed = 0});
      typename trainer_t::settings s;
      s.accelerator.precision = precision;
      s.accelerator.optimizer.lr = 1e-3;
      s.accelerator.scheduler = kiln::schedules::cosine{.warmup_steps = 100};
      s.options.steps = 2 * 468;
      s.options.progress = false;
      trainer_t t(s);
      return t.fit(model, loader, &test).final_eval.accuracy;
    };
    const double fp32 = accuracy((kiln::precision::fp32*)nullptr);
    const double bf16 = accuracy((kiln::precision::bf16*)nullptr);
    const double pure = accuracy((kiln::precision::bf16_pure*)nullptr);
    const double kahan = accuracy((kiln::precision::bf16_pure*)nullptr, {.kahan = true});
    MESSAGE("fp32 " << fp32 << ", bf16 " << bf16 << ", bf16-pure " << pure << ", bf16-pure with kahan " << kahan);
    CHECK(fp32 > 0.85);
    CHECK(std::abs(bf16 - fp32) <= 0.005);
    CHECK(std::abs(pure - fp32) <= 0.005);
    CHECK(std::abs(kahan - fp32) <= 0.005);
  }
}
