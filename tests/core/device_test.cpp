// Device placement: names resolve or are refused with the reason, a batch is placed where the
// model is, and what needs CUDA says so on a machine without it (CI has no GPU; the CUDA paths
// themselves are checked through the optimizers' tensor-op path, tests/optim).
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <ATen/Version.h>

#include <doctest/doctest.h>

#include "../temp_dir.hpp"

TEST_SUITE("device") {
  TEST_CASE("device names: cpu and auto resolve, misspellings list the accepted forms") {
    CHECK(kiln::resolve_device("cpu") == torch::Device(torch::kCPU));
    CHECK(kiln::resolve_device("auto") ==
          (torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU)));
    CHECK_THROWS_WITH_AS(kiln::resolve_device("gpu", "[train] device"),
                         doctest::Contains("[train] device = \"gpu\": expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\""),
                         kiln::config_error);
    CHECK_THROWS_AS(kiln::resolve_device("cuda:x"), kiln::config_error);
    for (const char* name : {"auto", "cpu", "cuda", "cuda:0", "cuda:12"}) CHECK(kiln::is_device_name(name));
    for (const char* name : {"CPU", "", "cuda:", "cuda:-1", "cuda: 1", "cuda:1x", " cpu", "cuda0", "cuda:1234567890"})
      CHECK_FALSE(kiln::is_device_name(name));
  }

  TEST_CASE("without CUDA, asking for it is an error that says why, in the recipe and the loader") {
    if (torch::cuda::is_available()) return;  // a GPU machine: nothing to refuse
    // Why, as LibTorch's own build report tells it: a CPU-only build (Debian's), or a CUDA build
    // (PyPI's) on a machine without a GPU.
    const auto config = at::show_config();
    const bool cuda_build = config.find("USE_CUDA=1") != std::string::npos || config.find("USE_CUDA=ON") != std::string::npos;
    CHECK_THROWS_WITH_AS(kiln::resolve_device("cuda", "f.toml: [train] device"),
                         doctest::Contains(cuda_build ? "f.toml: [train] device = \"cuda\": no CUDA device is visible to this process"
                                                      : "f.toml: [train] device = \"cuda\": this LibTorch was built without CUDA"),
                         kiln::config_error);
    CHECK_THROWS_AS(kiln::resolve_device("cuda:1"), kiln::config_error);
    CHECK_THROWS_AS(kiln::accelerator<>({.device = "cuda"}), kiln::config_error);
    const auto data = kiln::data::make_classification(64, 4, 2, 1);
    CHECK_THROWS_WITH_AS(kiln::data::batch_loader(data, {.batch_size = 8, .pin_memory = true}),
                         doctest::Contains("pin_memory"), kiln::data_error);
  }

  TEST_CASE("on an explicit cpu device the model trains exactly as on auto, and batches stay put") {
    auto train = [](const std::string& device) {
      torch::manual_seed(3);
      kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 4, .hidden = {8}, .classes = 2});
      kiln::accelerator<kiln::optim::adamw> acc({.optimizer = {.lr = 1e-2}, .device = device});
      acc.prepare(model);
      const auto data = kiln::data::make_classification(32, 4, 2, 5);
      for (int step = 0; step < 3; ++step) {
        const auto x = acc.place(data.inputs), y = acc.place(data.targets);
        CHECK(x.is_same(data.inputs));  // already where the model is: no copy
        acc.backward(torch::nn::functional::cross_entropy(model->forward(x), y));
        acc.step();
      }
      return model->parameters();
    };
    if (torch::cuda::is_available()) return;  // "auto" would be the GPU
    const auto on_cpu = train("cpu"), on_auto = train("auto");
    for (std::size_t i = 0; i < on_cpu.size(); ++i) CHECK(torch::equal(on_cpu[i], on_auto[i]));
  }
}
