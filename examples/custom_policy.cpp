// Writing a policy of your own: signSGD (Bernstein et al. 2018) on the optimizer axis.
//
// Start from the default's header (include/kiln/optim/sgd.hpp): it lists what the optimizer
// axis requires. A member missing here would stop the build with a sentence such as
//   "kiln: optimizer axis: policy is missing `void set_lr(double)`".
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <cstdio>

struct sign_sgd {
  using axis = kiln::axis::optimizer;
  static constexpr std::string_view kind = "sign-sgd";

  struct settings {
    double lr = 1e-3;
    template <class V>
    void describe(V& v) {
      v.field("lr", lr, "step size of every coordinate", kiln::checks::positive);
    }
  };

  explicit sign_sgd(const settings& s) : lr_(s.lr), base_lr_(s.lr) {}

  void attach(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
    for (const auto& [name, p] : named) params_.push_back(p);
  }
  void step() {
    torch::NoGradGuard no_grad;
    for (auto& p : params_)
      if (p.grad().defined()) p.add_(p.grad().sign(), -lr_);
  }
  void zero_grad() {
    for (auto& p : params_)
      if (p.grad().defined()) p.grad().zero_();
  }
  void set_lr(double lr) { lr_ = lr; }
  double base_lr() const { return base_lr_; }
  std::int64_t state_bytes() const { return 0; }  // signSGD keeps no state

 private:
  double lr_, base_lr_;
  std::vector<torch::Tensor> params_;
};

int main() {
  // The custom policy composes with kiln's own ones like any other.
  using trainer_t = kiln::trainer<sign_sgd, kiln::precision::fp32>;

  torch::manual_seed(0);
  auto all = kiln::data::make_classification(2560, 16, 4, /*seed=*/3);
  kiln::data::tensor_pair train{all.inputs.slice(0, 0, 2048), all.targets.slice(0, 0, 2048)};
  kiln::data::tensor_pair test{all.inputs.slice(0, 2048), all.targets.slice(0, 2048)};
  kiln::data::batch_loader loader(train, {.batch_size = 64});
  kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 16, .hidden = {64}, .classes = 4});

  trainer_t::settings settings;
  settings.accelerator.optimizer.lr = 2e-3;
  settings.accelerator.scheduler = kiln::schedules::cosine{};
  settings.options.steps = 400;
  settings.options.progress = false;
  trainer_t trainer(settings);
  auto summary = trainer.fit(model, loader, &test);
  std::printf("sign-sgd: test accuracy %.1f%%\n", 100.0 * summary.final_eval.accuracy);
  return summary.final_eval.accuracy > 0.75 ? 0 : 1;
}
