// A program outside kiln's tree: composes a trainer from policies in one line and trains an
// MLP on a synthetic classification task.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <cstdio>

int main() {
  using trainer_t = kiln::trainer<kiln::optim::adamw>;  // the other axes take their defaults

  torch::manual_seed(0);
  auto all = kiln::data::make_classification(3072, 16, 4, /*seed=*/7);
  kiln::data::tensor_pair train{all.inputs.slice(0, 0, 2048), all.targets.slice(0, 0, 2048)};
  kiln::data::tensor_pair test{all.inputs.slice(0, 2048), all.targets.slice(0, 2048)};
  kiln::data::batch_loader loader(train, {.batch_size = 64});

  kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 16, .hidden = {64}, .classes = 4});
  trainer_t::settings settings;
  settings.accelerator.optimizer.lr = 3e-3;
  settings.options.steps = 300;
  settings.options.progress = false;
  trainer_t trainer(settings);
  auto summary = trainer.fit(model, loader, &test);

  std::printf("consumer: %lld steps, test accuracy %.1f%%\n", (long long)summary.steps,
              100.0 * summary.final_eval.accuracy);
  return summary.final_eval.accuracy > 0.8 ? 0 : 1;
}
