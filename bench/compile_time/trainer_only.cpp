// examples/consumer/main.cpp with the headers its trainer needs instead of kiln.hpp: what a
// user TU with one trainer type costs once kiln.hpp stops pulling in recipes, toml++ and every
// model and loader (issue 30, item 4).
#include <kiln/data/loader.hpp>
#include <kiln/data/synthetic.hpp>
#include <kiln/models/mlp.hpp>
#include <kiln/optim/adamw.hpp>
#include <kiln/trainer.hpp>

#include <cstdio>

int main() {
  using trainer_t = kiln::trainer<kiln::optim::adamw>;
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
  std::printf("test accuracy %.1f%%\n", 100.0 * summary.final_eval.accuracy);
}
