// kiln/data/views.hpp: datasets composed the way range-v3 composes views.
//
//   using namespace kiln::data;
//   auto shirts_and_coats = in_memory(fashion) | views::filter(is_top) | views::map(to_two_classes);
//   loader l(shirts_and_coats, {.batch_size = 64, .workers = 2}, compose(random_crop{4}, horizontal_flip{}));
//
// Each adaptor gives a dataset again (size(), get(i): random access), so the loader's shuffling,
// workers, sharding and exact resume work on the result unchanged, and a whole-batch gather()
// survives filter and take. views::map is for deterministic per-sample work (a cast, a
// relabelling); random augmentations belong in the loader's transform, which is seeded per sample.
// as_range(d) goes the other way: a random-access range-v3 view of a dataset's examples, for any
// range-v3 algorithm.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <range/v3/range/conversion.hpp>
#include <range/v3/view/filter.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/torch.h>

#include "kiln/data/dataset.hpp"
#include "kiln/errors.hpp"

namespace kiln::data {

// The examples of `d` as a random-access range-v3 view; `d` must outlive it.
template <dataset D>
auto as_range(const D& d) {
  return ranges::views::iota(std::int64_t{0}, static_cast<std::int64_t>(d.size())) |
         ranges::views::transform([&d](std::int64_t i) -> example { return d.get(i); });
}

// `f(example) -> example` applied to every example of `D`, when it is read.
template <dataset D, class F>
class mapped {
 public:
  mapped(D data, F f) : data_(std::move(data)), f_(std::move(f)) {}
  std::int64_t size() const { return static_cast<std::int64_t>(data_.size()); }
  example get(std::int64_t i) const { return f_(data_.get(i)); }

 private:
  D data_;
  F f_;
};

// The examples of `D` at a fixed list of indices (what filter and take select).
template <dataset D>
class subset {
 public:
  subset(D data, std::vector<std::int64_t> indices)
      : data_(std::move(data)), indices_(torch::tensor(indices, torch::kInt64)) {
    const auto n = static_cast<std::int64_t>(data_.size());
    for (auto i : indices)
      if (i < 0 || i >= n)
        throw data_error("subset index " + std::to_string(i) + " is outside the dataset's " + std::to_string(n) +
                         " samples");
  }
  std::int64_t size() const { return indices_.size(0); }
  example get(std::int64_t i) const { return data_.get(indices_.data_ptr<std::int64_t>()[i]); }
  batch gather(const torch::Tensor& indices) const
    requires gathers_batches<D>
  {
    return data_.gather(indices_.index_select(0, indices));
  }

 private:
  D data_;
  torch::Tensor indices_;  // int64, read through data_ptr by get() (from any worker: read-only)
};

}  // namespace kiln::data

namespace kiln::detail {

// What `dataset | adaptor` calls: make(dataset) builds the adapted dataset.
template <class Make>
struct dataset_adaptor {
  Make make;
};

template <data::dataset D, class Make>
auto operator|(D d, dataset_adaptor<Make> adaptor) {
  return adaptor.make(std::move(d));
}

}  // namespace kiln::detail

namespace kiln::data::views {

// Every example through f: f(example) -> example, callable from worker threads at once.
template <class F>
auto map(F f) {
  return kiln::detail::dataset_adaptor{[f = std::move(f)]<dataset D>(D d) {
    static_assert(std::is_invocable_r_v<example, const F&, example>,
                  "kiln::data::views::map: f must be callable as `example f(example) const`");
    return mapped<D, F>(std::move(d), f);
  }};
}

// The examples for which keep(example) is true, decided once, here: each example is read once.
template <class Predicate>
auto filter(Predicate keep) {
  return kiln::detail::dataset_adaptor{[keep = std::move(keep)]<dataset D>(D d) {
    static_assert(std::is_invocable_r_v<bool, const Predicate&, const example&>,
                  "kiln::data::views::filter: keep must be callable as `bool keep(const example&) const`");
    auto indices = ranges::views::iota(std::int64_t{0}, static_cast<std::int64_t>(d.size())) |
                   ranges::views::filter([&](std::int64_t i) { return keep(d.get(i)); }) |
                   ranges::to<std::vector<std::int64_t>>();
    return subset<D>(std::move(d), std::move(indices));
  }};
}

// The first n examples (all of them if there are fewer).
inline auto take(std::int64_t n) {
  if (n < 0) throw data_error("views::take: n must be >= 0, got " + std::to_string(n));
  return kiln::detail::dataset_adaptor{[n]<dataset D>(D d) {
    const auto count = std::min(n, static_cast<std::int64_t>(d.size()));
    return subset<D>(std::move(d), ranges::views::iota(std::int64_t{0}, count) | ranges::to<std::vector<std::int64_t>>());
  }};
}

}  // namespace kiln::data::views
