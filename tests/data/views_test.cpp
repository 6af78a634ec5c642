// Dataset views (filter, map, take, as_range): checked against the same selection made by hand,
// and through the loader, which must see every selected sample once per epoch.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

#include <range/v3/algorithm/count_if.hpp>

#include <set>
#include <vector>

namespace {

// 50 samples: input [2] = {i, -i}, target i % 5.
kiln::data::in_memory numbered() {
  auto i = torch::arange(50, torch::kFloat);
  return kiln::data::tensor_pair{torch::stack({i, -i}, 1), torch::arange(50, torch::kInt64).remainder(5)};
}

bool is_class_3(const kiln::data::example& e) { return e.target.item<std::int64_t>() == 3; }

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("views: filter keeps exactly the matching samples, in order, and still gathers whole batches") {
    using namespace kiln::data;
    auto threes = numbered() | views::filter(is_class_3);
    static_assert(gathers_batches<decltype(threes)>);
    REQUIRE(threes.size() == 10);
    for (std::int64_t k = 0; k < threes.size(); ++k) CHECK(threes.get(k).input[0].item<float>() == 3 + 5 * k);
    const auto b = threes.gather(torch::tensor({9, 0}, torch::kInt64));
    CHECK(torch::equal(b.inputs.select(1, 0), torch::tensor({48.f, 3.f})));
  }

  TEST_CASE("views: map, take and filter compose, and as_range feeds range-v3 algorithms") {
    using namespace kiln::data;
    auto doubled = numbered() | views::take(20) | views::map([](example e) {
                     e.input = e.input * 2;
                     return e;
                   }) |
                   views::filter(is_class_3);
    static_assert(!gathers_batches<decltype(doubled)>);  // map runs per sample: no whole-batch path
    REQUIRE(doubled.size() == 4);                           // 3, 8, 13, 18
    CHECK(doubled.get(3).input[0].item<float>() == 36.f);
    CHECK(doubled.get(3).input[1].item<float>() == -36.f);

    const auto even_inputs = ranges::count_if(as_range(numbered()),
                                              [](const example& e) { return e.input[0].item<std::int64_t>() % 2 == 0; });
    CHECK(even_inputs == 25);
    CHECK_THROWS_AS(numbered() | views::take(-1), kiln::data_error);
  }

  TEST_CASE("views: the loader sees every filtered sample once per epoch, with and without workers") {
    using namespace kiln::data;
    for (std::int64_t workers : {0, 2}) {
      loader l(numbered() | views::filter([](const example& e) { return e.target.item<std::int64_t>() != 0; }),
               {.batch_size = 8, .drop_last = false, .seed = 3, .workers = workers});
      std::multiset<float> seen;
      for (std::int64_t b = 0; b < l.batches_per_epoch(); ++b) {
        auto batch = l.next();
        for (std::int64_t r = 0; r < batch.inputs.size(0); ++r) seen.insert(batch.inputs[r][0].item<float>());
      }
      std::multiset<float> expected;
      for (int i = 0; i < 50; ++i)
        if (i % 5 != 0) expected.insert(static_cast<float>(i));
      CHECK(seen == expected);
    }
  }
}
