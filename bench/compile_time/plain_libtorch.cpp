// A plain LibTorch training loop: an MLP, SGD, cross-entropy (the reference TU for compile time).
#include <torch/torch.h>
#include <cstdio>
int main() {
  torch::manual_seed(0);
  auto x = torch::randn({2048, 16});
  auto y = torch::randint(4, {2048});
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  for (int step = 0; step < 300; ++step) {
    auto i = torch::randint(2048, {64}, torch::kLong);
    auto loss = torch::nn::functional::cross_entropy(model->forward(x.index_select(0, i)), y.index_select(0, i));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  std::printf("%f\n", torch::nn::functional::cross_entropy(model->forward(x), y).item<double>());
}
