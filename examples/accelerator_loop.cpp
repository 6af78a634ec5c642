// Owning the loop yourself (the Accelerate shape): kiln::accelerator does accumulation,
// clipping, the schedule and the optimizer; you write the for loop.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <cstdio>

int main() {
  torch::manual_seed(0);
  auto data = kiln::data::make_classification(2048, 16, 4, /*seed=*/5);
  kiln::data::batch_loader loader(data, {.batch_size = 32});
  kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 16, .hidden = {64}, .classes = 4});

  kiln::accelerator<kiln::optim::adamw> acc({
      .accumulation = {.steps = 2},  // 2 micro-batches of 32 per optimizer step
      .optimizer = {.lr = 3e-3},
      .scheduler = kiln::schedules::linear{.warmup_steps = 20},
      .clip_grad_norm = 1.0,
      .total_steps = 300,
  });
  acc.prepare(model);

  double last_loss = 0;
  while (acc.optimizer_steps() < 300) {
    auto batch = loader.next();
    auto micro = acc.accumulate();  // steps the optimizer when this micro-step ends a window
    torch::Tensor loss;
    {
      auto cast = acc.autocast();
      // place(): onto the model's device ([train] device "auto": a GPU where there is one).
      loss = torch::nn::functional::cross_entropy(model->forward(acc.place(batch.inputs)), acc.place(batch.targets));
    }
    acc.backward(loss);
    last_loss = loss.item<double>();
  }
  std::printf("accelerator loop: 300 optimizer steps, last micro-batch loss %.3f\n", last_loss);
  return last_loss < 0.8 ? 0 : 1;
}
