// kiln_bench_data: images/s of an augmentation pipeline made by kiln's loader and by LibTorch's
// torch::data::DataLoader, with 0, 1 and 2 workers (issue 7; bench/data_bench.py is the Python
// side, bench/run_data prints the table).
//
//   kiln_bench_data --threads N --rounds R [--batches B] [--warmup W] [--workers 0,1,2]
//
// Pipeline: the Fashion-MNIST training set (float32 [60000, 1, 28, 28], standardised), shuffled,
// each sample randomly cropped after 4 px of zero padding and flipped left-right with p = 0.5,
// batches of 128. The torch::data side is the dataset a LibTorch user would write: get(i) runs the
// same tensor ops as kiln's random_crop and horizontal_flip (checked below to give the very same
// tensors for the same draws), `.map(Stack<>())` collates.
//
// Each measurement builds a fresh loader, takes `warmup` batches (worker start-up, prefetch fill)
// and then times `batches` more: the steady rate a training loop would see, with nothing but the
// loader in the loop. Rounds alternate kiln and torch::data for each worker count (neighbours on a
// shared machine disturb both alike); reported is the median over rounds. Bound: every image must
// at least be read once and written once into its batch, at the copy bandwidth measured here.
// Output: JSON lines on stdout.
#include <kiln/data/fashion_mnist.hpp>
#include <kiln/data/loader.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using kiln_bench::median;

constexpr std::int64_t batch_size = 128;
constexpr std::int64_t padding = 4;

// The augmentation as a LibTorch user writes it: the same draws, in the same order, and the same
// tensor ops as kiln::data::random_crop{4} then horizontal_flip{0.5}, so that the two loaders do
// the same work per sample and differ only in how they schedule and collate it.
torch::Tensor augment(const torch::Tensor& x, kiln::data::sample_rng& rng) {
  std::uniform_int_distribution<std::int64_t> shift(-padding, padding);
  const auto dy = shift(rng), dx = shift(rng);
  const auto h = x.size(-2), w = x.size(-1);
  auto out = torch::zeros_like(x);
  const auto rows = h - std::abs(dy), cols = w - std::abs(dx);
  out.narrow(-2, std::max<std::int64_t>(0, -dy), rows)
      .narrow(-1, std::max<std::int64_t>(0, -dx), cols)
      .copy_(x.narrow(-2, std::max<std::int64_t>(0, dy), rows).narrow(-1, std::max<std::int64_t>(0, dx), cols));
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) < 0.5) out = out.flip({-1});
  return out;
}

// torch::data's dataset: the loader copies it into each worker thread (the tensors share
// storage). Each thread draws from its own generator: torch::data has no per-sample seeding, and
// a shared generator would need a lock.
class augmented_dataset : public torch::data::datasets::Dataset<augmented_dataset> {
 public:
  explicit augmented_dataset(kiln::data::tensor_pair data) : data_(std::move(data)) {}
  torch::data::Example<> get(size_t index) override {
    thread_local kiln::data::sample_rng rng(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    const auto i = static_cast<std::int64_t>(index);
    return {augment(data_.inputs[i], rng), data_.targets[i]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(data_.inputs.size(0)); }

 private:
  kiln::data::tensor_pair data_;
};

auto kiln_transform() { return kiln::data::compose(kiln::data::random_crop{padding}, kiln::data::horizontal_flip{0.5}); }

kiln::data::loader_options kiln_options(std::int64_t workers) {
  return {.batch_size = batch_size, .shuffle = true, .drop_last = true, .seed = 0, .workers = workers,
          .prefetch = std::max<std::int64_t>(2, workers)};
}

// Sums one element per batch: the batches must be looked at, or a loader could be timed doing
// nothing that is used (it cannot here, but the timing should not depend on that).
double sink = 0;

// Seconds for `batches` batches after `warmup` ones, from a fresh kiln loader.
double time_kiln(const kiln::data::tensor_pair& data, std::int64_t workers, std::int64_t warmup,
                 std::int64_t batches) {
  kiln::data::loader loader(kiln::data::in_memory(data), kiln_options(workers), kiln_transform());
  for (std::int64_t b = 0; b < warmup; ++b) sink += loader.next().inputs.data_ptr<float>()[0];
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t b = 0; b < batches; ++b) sink += loader.next().inputs.data_ptr<float>()[0];
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

auto make_torch_loader(const kiln::data::tensor_pair& data, std::int64_t workers) {
  return torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      augmented_dataset(data).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(batch_size).workers(workers).drop_last(true));
}

double time_torch(const kiln::data::tensor_pair& data, std::int64_t workers, std::int64_t warmup,
                  std::int64_t batches) {
  auto loader = make_torch_loader(data, workers);
  auto it = loader->begin();
  // main() keeps warmup + batches within one epoch: the iterator never reaches its end here.
  for (std::int64_t b = 0; b < warmup; ++b, ++it) sink += it->data.data_ptr<float>()[0];
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t b = 0; b < batches; ++b, ++it) sink += it->data.data_ptr<float>()[0];
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double copy_bandwidth() {
  auto src = torch::randn({16 << 20}), dst = torch::empty_like(src);
  double best = 1e9;
  for (int i = 0; i < 10; ++i) {
    auto start = std::chrono::steady_clock::now();
    dst.copy_(src);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(src.numel()) * 4 / best;
}

std::string list_json(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(std::llround(v[i]));
  return s + "]";
}

std::string shape_json(const torch::Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << "]";
  return s.str();
}

// Before timing anything: the two loaders must produce the same kind of batch, and the
// hand-written augmentation must be kiln's. Exits non-zero (no table) if not.
void check(const kiln::data::tensor_pair& data) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "kiln_bench_data: check failed: %s\n", what.c_str());
    std::exit(1);
  };
  // Same generator state in, same tensor out (400 seeds: shifts of every size, both flips).
  const auto transform = kiln_transform();
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    const auto i = static_cast<std::int64_t>(seed * 149 % data.inputs.size(0));
    kiln::data::example e{data.inputs[i], data.targets[i]};
    kiln::data::sample_rng a(seed), b(seed);
    transform(e, a);
    if (!torch::equal(e.input, augment(data.inputs[i], b)))
      fail("the hand-written augmentation differs from kiln's for sample " + std::to_string(i));
  }
  kiln::data::loader kiln_loader(kiln::data::in_memory(data), kiln_options(2), kiln_transform());
  const auto k = kiln_loader.next();
  auto torch_loader = make_torch_loader(data, 2);
  const auto t = *torch_loader->begin();
  if (k.inputs.sizes() != t.data.sizes() || k.inputs.scalar_type() != t.data.scalar_type() ||
      k.targets.sizes() != t.target.sizes() || k.targets.scalar_type() != t.target.scalar_type())
    fail("kiln's batch is " + shape_json(k.inputs) + " / " + shape_json(k.targets) + ", torch::data's " +
         shape_json(t.data) + " / " + shape_json(t.target));
  if (!k.inputs.is_contiguous() || !t.data.is_contiguous()) fail("a batch is not contiguous");
  // Augmented, not raw: a shift puts zero rows or columns into 80 of 81 crops, while a raw
  // standardised image has no exact zeros (its background is -0.81).
  auto zero_images = [](const torch::Tensor& x) { return (x == 0).flatten(1).any(1).sum().item<std::int64_t>(); };
  if (zero_images(k.inputs) < batch_size / 2 || zero_images(t.data) < batch_size / 2)
    fail("fewer than half of the images have padding zeros: not augmented?");
  std::printf("{\"check\": \"ok\", \"kiln_batch\": [%s, %s], \"torch_data_batch\": [%s, %s], "
              "\"augmentation_equal_to_kiln\": true}\n",
              shape_json(k.inputs).c_str(), shape_json(k.targets).c_str(), shape_json(t.data).c_str(),
              shape_json(t.target).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const kiln_bench::flags flags(argc, argv, {"--threads", "--rounds", "--batches", "--warmup", "--workers"});
  const char* env_rounds = std::getenv("KILN_BENCH_ROUNDS");
  const std::int64_t threads = flags.integer("--threads", 2), batches = flags.integer("--batches", 200),
                     warmup = flags.integer("--warmup", 10),
                     rounds = flags.integer("--rounds", env_rounds ? std::stoll(env_rounds) : 5);
  std::vector<std::int64_t> worker_counts;
  std::stringstream list(flags.text("--workers", "0,1,2"));
  for (std::string w; std::getline(list, w, ',');) worker_counts.push_back(std::stoll(w));
  // The main thread's intra-op threads, as the Python side's torch.set_num_threads; worker
  // threads of either loader share this pool (per-sample ops are too small to split anyway).
  at::set_num_threads(static_cast<int>(threads));
  torch::NoGradGuard no_grad;
  const auto data = kiln::data::load_fashion_mnist(kiln::data::default_fashion_mnist_dir, kiln::data::split::train);
  // torch::data's iterator ends with the epoch (kiln's loader would roll over): one epoch at most.
  if ((warmup + batches) * batch_size > data.inputs.size(0)) {
    std::fprintf(stderr, "kiln_bench_data: --warmup + --batches must fit in one epoch (%lld batches)\n",
                 (long long)(data.inputs.size(0) / batch_size));
    return 2;
  }
  check(data);

  const double bandwidth = copy_bandwidth();
  const double bytes_per_image = static_cast<double>(data.inputs[0].numel()) * 4;
  std::printf("{\"bound_images_per_s\": %.0f, \"bytes_per_image\": %.0f, \"bandwidth_gbs\": %.2f}\n",
              bandwidth / (2 * bytes_per_image), bytes_per_image, bandwidth / 1e9);

  const auto images = static_cast<double>(batches * batch_size);
  for (const auto workers : worker_counts) {
    std::vector<double> kiln_rate, torch_rate;
    for (std::int64_t r = 0; r < rounds; ++r) {
      // Alternate which goes first: the second of a pair may find the caches and the machine warmer.
      if (r % 2 == 0) {
        kiln_rate.push_back(images / time_kiln(data, workers, warmup, batches));
        torch_rate.push_back(images / time_torch(data, workers, warmup, batches));
      } else {
        torch_rate.push_back(images / time_torch(data, workers, warmup, batches));
        kiln_rate.push_back(images / time_kiln(data, workers, warmup, batches));
      }
      std::fprintf(stderr, "  workers %lld, round %lld: kiln %.0f img/s, torch::data %.0f img/s\n",
                   (long long)workers, (long long)r, kiln_rate.back(), torch_rate.back());
    }
    std::vector<double> ratio;
    for (std::size_t r = 0; r < kiln_rate.size(); ++r) ratio.push_back(kiln_rate[r] / torch_rate[r]);
    std::printf("{\"loader\": \"kiln\", \"workers\": %lld, \"threads\": %lld, \"images_per_s\": %.0f, "
                "\"rounds_images_per_s\": %s}\n",
                (long long)workers, (long long)threads, median(kiln_rate), list_json(kiln_rate).c_str());
    std::printf("{\"loader\": \"torch::data\", \"workers\": %lld, \"threads\": %lld, \"images_per_s\": %.0f, "
                "\"rounds_images_per_s\": %s, \"kiln_ratio_median\": %.3f}\n",
                (long long)workers, (long long)threads, median(torch_rate), list_json(torch_rate).c_str(),
                median(ratio));
    std::fflush(stdout);
  }
  if (sink == 1e300) std::printf("\n");  // keeps `sink` alive
  return 0;
}
