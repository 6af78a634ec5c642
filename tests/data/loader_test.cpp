// The loader: every sample once per epoch, the same batches for any worker count, exact resume,
// disjoint distributed shards, transforms, and worker errors that reach the caller.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <set>
#include <stdexcept>

namespace {

// Sample i is the image filled with i (1 x 4 x 4) and target i: a batch says which samples it holds.
struct numbered {
  std::int64_t n = 103;
  std::int64_t throw_at = -1;
  std::int64_t size() const { return n; }
  kiln::data::example get(std::int64_t i) const {
    if (i == throw_at) throw std::runtime_error("unreadable record");
    return {torch::full({1, 4, 4}, static_cast<float>(i)), torch::tensor(i)};
  }
};

// Adds noise from the sample's generator: shows whether augmentation depends on the worker.
struct noise {
  void operator()(kiln::data::example& e, kiln::data::sample_rng& rng) const {
    e.input = e.input + static_cast<float>(std::uniform_real_distribution<double>(0, 1)(rng));
  }
};

template <class Loader>
std::vector<kiln::data::batch> take(Loader& loader, std::int64_t count) {
  std::vector<kiln::data::batch> out;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(loader.next());
  return out;
}

bool same(const std::vector<kiln::data::batch>& a, const std::vector<kiln::data::batch>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i].inputs, b[i].inputs) || !torch::equal(a[i].targets, b[i].targets)) return false;
  return true;
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("loader: every sample exactly once per epoch, for any worker count") {
    for (const std::int64_t workers : {0, 1, 3}) {
      CAPTURE(workers);
      kiln::data::loader loader(numbered{}, {.batch_size = 10, .drop_last = false, .seed = 7, .workers = workers});
      CHECK(loader.batches_per_epoch() == 11);
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::multiset<std::int64_t> seen;
        for (std::int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
          auto batch = loader.next();
          CHECK(batch.inputs.sizes() == torch::IntArrayRef({b == 10 ? 3 : 10, 1, 4, 4}));
          for (std::int64_t k = 0; k < batch.targets.size(0); ++k) {
            seen.insert(batch.targets[k].item<std::int64_t>());
            CHECK(batch.inputs[k].eq(batch.targets[k].to(torch::kFloat)).all().item<bool>());  // collated in place
          }
        }
        CHECK(seen.size() == 103);
        CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == 103);
      }
    }
  }

  TEST_CASE("loader: one seed gives the same batches, augmentation included, whatever the workers") {
    auto run = [](std::int64_t workers, std::int64_t prefetch) {
      kiln::data::loader loader(numbered{}, {.batch_size = 8, .seed = 3, .workers = workers, .prefetch = prefetch},
                                noise{});
      return take(loader, 30);  // across an epoch boundary (12 batches an epoch)
    };
    const auto reference = run(0, 1);
    CHECK(same(reference, run(1, 1)));
    CHECK(same(reference, run(2, 4)));
    CHECK(same(reference, run(4, 2)));
    // and the epochs differ: reshuffled, and the noise is drawn afresh
    CHECK(!torch::equal(reference[0].targets, reference[12].targets));
  }

  TEST_CASE("loader: resuming mid-epoch gives the remaining batches of the uninterrupted run") {
    for (const std::int64_t workers : {0, 2}) {
      CAPTURE(workers);
      kiln::data::loader whole(numbered{}, {.batch_size = 8, .seed = 11, .workers = workers}, noise{});
      const auto reference = take(whole, 20);
      kiln::data::loader first(numbered{}, {.batch_size = 8, .seed = 11, .workers = workers}, noise{});
      take(first, 7);
      kiln::state_dict state;
      first.save_state(state, "data/");
      kiln::data::loader resumed(numbered{}, {.batch_size = 8, .seed = 11, .workers = workers}, noise{});
      resumed.load_state(state, "data/");
      CHECK(same(take(resumed, 13), std::vector<kiln::data::batch>(reference.begin() + 7, reference.end())));
      // and the loader that was saved carries on unchanged
      CHECK(same(take(first, 13), std::vector<kiln::data::batch>(reference.begin() + 7, reference.end())));
    }
  }

  TEST_CASE("loader: distributed shards are disjoint and complete, the same size on every rank") {
    for (const bool pad : {true, false}) {
      CAPTURE(pad);
      std::vector<std::int64_t> all;
      std::int64_t batches = -1;
      for (std::int64_t rank = 0; rank < 3; ++rank) {
        kiln::data::loader loader(numbered{.n = 100},
                                  {.batch_size = 5, .drop_last = false, .seed = 2, .rank = rank, .world = 3, .pad_shards = pad});
        CHECK(loader.samples() == (pad ? 34 : 33));
        if (batches >= 0) CHECK(loader.batches_per_epoch() == batches);
        batches = loader.batches_per_epoch();
        for (std::int64_t b = 0; b < batches; ++b) {
          auto t = loader.next().targets;
          for (std::int64_t k = 0; k < t.size(0); ++k) all.push_back(t[k].item<std::int64_t>());
        }
      }
      const std::set<std::int64_t> distinct(all.begin(), all.end());
      if (pad) {
        CHECK(all.size() == 102);  // 100 + 2 samples repeated so that every rank has 34
        CHECK(distinct.size() == 100);
      } else {
        CHECK(all.size() == 99);  // one sample left out this epoch, none twice
        CHECK(distinct.size() == 99);
      }
    }
  }

  TEST_CASE("loader: an error in a worker reaches next() with the sample, and nothing hangs") {
    for (const std::int64_t workers : {0, 2}) {
      CAPTURE(workers);
      auto outcome = std::async(std::launch::async, [workers] {
        kiln::data::loader loader(numbered{.throw_at = 42}, {.batch_size = 10, .shuffle = false, .workers = workers});
        take(loader, 4);  // samples 0-39 are fine
        try {
          loader.next();
        } catch (const kiln::data_error& e) {
          return std::string(e.what());
        }
        return std::string("no error");
      });
      REQUIRE(outcome.wait_for(std::chrono::seconds(30)) == std::future_status::ready);  // also: the destructor joined
      const auto message = outcome.get();
      CHECK(message.find("sample 42") != std::string::npos);
      CHECK(message.find("unreadable record") != std::string::npos);
    }
  }

  TEST_CASE("loader: samples of different shapes are refused with the sample's index") {
    struct ragged {
      std::int64_t size() const { return 8; }
      kiln::data::example get(std::int64_t i) const { return {torch::zeros({i == 5 ? 3 : 4}), torch::tensor(i)}; }
    };
    kiln::data::loader loader(ragged{}, {.batch_size = 8, .shuffle = false});
    try {
      loader.next();
      FAIL("expected a data_error");
    } catch (const kiln::data_error& e) {
      CHECK(std::string(e.what()).find("sample 5: its input has shape [3]") != std::string::npos);
    }
  }

  TEST_CASE("transforms: random crop shifts within the padding, flip mirrors, both seeded") {
    auto image = torch::arange(16, torch::kFloat).view({1, 4, 4});
    kiln::data::sample_rng rng(1);
    std::set<std::pair<std::int64_t, std::int64_t>> shifts;
    for (int i = 0; i < 200; ++i) {
      kiln::data::example e{image.clone(), torch::tensor(0)};
      kiln::data::random_crop{.padding = 1}(e, rng);
      CHECK(e.input.sizes() == image.sizes());
      // find the shift: the crop is the image moved by (dy, dx) with zeros coming in
      bool found = false;
      for (int dy = -1; dy <= 1 && !found; ++dy)
        for (int dx = -1; dx <= 1 && !found; ++dx) {
          auto expected = torch::zeros_like(image);
          const int rows = 4 - std::abs(dy), cols = 4 - std::abs(dx);
          expected.narrow(1, std::max(0, -dy), rows).narrow(2, std::max(0, -dx), cols)
              .copy_(image.narrow(1, std::max(0, dy), rows).narrow(2, std::max(0, dx), cols));
          if (torch::equal(e.input, expected)) found = true, shifts.insert({dy, dx});
        }
      CHECK(found);
    }
    CHECK(shifts.size() == 9);  // every shift in [-1, 1]^2 occurs

    int flipped = 0;
    for (int i = 0; i < 400; ++i) {
      kiln::data::example e{image.clone(), torch::tensor(0)};
      kiln::data::compose(kiln::data::horizontal_flip{.probability = 0.25})(e, rng);
      if (torch::equal(e.input, image.flip({-1}))) ++flipped;
      else CHECK(torch::equal(e.input, image));
    }
    CHECK(flipped > 60);
    CHECK(flipped < 140);

    // Contiguous CPU images take a loop, others the tensor ops: the same draws give the same image.
    const auto strided = torch::arange(2 * 5 * 6, torch::kFloat).view({2, 6, 5}).transpose(1, 2);
    REQUIRE(!strided.is_contiguous());
    const auto both = kiln::data::compose(kiln::data::random_crop{.padding = 2}, kiln::data::horizontal_flip{});
    for (std::uint64_t seed = 0; seed < 50; ++seed) {
      kiln::data::example fast{strided.contiguous(), torch::tensor(0)}, general{strided, torch::tensor(0)};
      kiln::data::sample_rng a(seed), b(seed);
      both(fast, a);
      both(general, b);
      CHECK(torch::equal(fast.input, general.input));
    }
  }
}
