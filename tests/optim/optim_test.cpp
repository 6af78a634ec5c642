// Optimizer policies against LibTorch's own optimizers, and state that resumes exactly.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

namespace {

struct fixture {
  kiln::models::mlp model;
  kiln::data::tensor_pair data;
  explicit fixture(std::uint64_t seed)
      : model((torch::manual_seed(seed), kiln::models::mlp_settings{.in_features = 10, .hidden = {24}, .classes = 3})),
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

double max_relative_diff(torch::nn::Module& a, torch::nn::Module& b) {
  double diff = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    diff = std::max(diff, ((pa[i] - pb[i]).abs() / (pb[i].abs() + 1e-12)).max().item<double>());
  return diff;
}

template <class Policy, class Reference>
void compare_for_100_steps(typename Policy::settings settings, Reference make_reference) {
  fixture a(11), b(11);
  Policy policy(settings);
  policy.attach(named(*a.model));
  auto reference = make_reference(b.model->parameters());
  for (int step = 0; step < 100; ++step) {
    policy.zero_grad();
    a.loss(step).backward();
    policy.step();
    reference.zero_grad();
    b.loss(step).backward();
    reference.step();
  }
  CHECK(max_relative_diff(*a.model, *b.model) <= 1e-6);
}

// Trains k steps, saves the policy's state by name, loads it into a fresh policy over a copy of
// the model, and checks that both continue identically.
template <class Policy>
void check_resume(typename Policy::settings settings) {
  fixture a(21), b(21);
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
    compare_for_100_steps<kiln::optim::adamw>({.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-7, .weight_decay = 0.1},
                                              [](std::vector<torch::Tensor> params) {
                                                return torch::optim::AdamW(params, torch::optim::AdamWOptions(3e-3)
                                                                                       .betas({0.8, 0.99})
                                                                                       .eps(1e-7)
                                                                                       .weight_decay(0.1));
                                              });
  }

  TEST_CASE("sgd matches torch::optim::SGD (momentum, nesterov, weight decay) over 100 steps") {
    compare_for_100_steps<kiln::optim::sgd>({.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true},
                                            [](std::vector<torch::Tensor> params) {
                                              return torch::optim::SGD(params, torch::optim::SGDOptions(0.05)
                                                                                   .momentum(0.9)
                                                                                   .weight_decay(1e-3)
                                                                                   .nesterov(true));
                                            });
  }

  TEST_CASE("optimizer state saved by parameter name resumes identically") {
    check_resume<kiln::optim::adamw>({.lr = 1e-2});
    check_resume<kiln::optim::sgd>({.lr = 0.05, .momentum = 0.9});
  }

  TEST_CASE("state of the wrong shape is refused with the parameter's name") {
    fixture a(3);
    kiln::optim::adamw opt({});
    opt.attach(named(*a.model));
    kiln::state_dict state;
    state["optim/layers.0.weight/step"] = kiln::scalar_tensor(std::int64_t{3});
    state["optim/layers.0.weight/exp_avg"] = torch::zeros({2, 2});
    CHECK_THROWS_WITH_AS(opt.load_state(state, "optim/"), doctest::Contains("optim/layers.0.weight/exp_avg"),
                         kiln::state_error);
  }
}
