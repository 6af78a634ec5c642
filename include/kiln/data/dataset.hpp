// kiln/data/dataset.hpp: what the loader reads from.
//
// A dataset is any type with `size()` and `get(i) -> example`: a concept, not a base class, so
// the loader calls a user's dataset directly, without a virtual call per sample. A dataset that
// can gather a whole batch at once (kiln::data::in_memory: one index_select per tensor) also
// offers `gather(indices) -> batch`, which the loader uses when no per-sample transform is set.
//
//   struct my_dataset {
//     std::int64_t size() const;
//     kiln::data::example get(std::int64_t i) const;  // called from worker threads: no shared mutable state
//   };
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "kiln/data/tensor_pair.hpp"
#include "kiln/errors.hpp"

namespace kiln::data {

// One sample: an input and its target (a class index, a token sequence, ...).
struct example {
  torch::Tensor input;
  torch::Tensor target;
};

// A batch: examples stacked along a new first dimension.
struct batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

template <class D>
concept dataset = requires(const D& d, std::int64_t i) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  { d.get(i) } -> std::convertible_to<example>;
};

template <class D>
concept gathers_batches = dataset<D> && requires(const D& d, const torch::Tensor& indices) {
  { d.gather(indices) } -> std::convertible_to<batch>;
};

// A dataset held as two tensors (Fashion-MNIST, the synthetic sets): row i of inputs goes with
// row i of targets. (Implicit from a tensor_pair: every in-memory source returns one.)
class in_memory {
 public:
  in_memory(tensor_pair data) : data_(std::move(data)) {  // NOLINT(google-explicit-constructor)
    if (!data_.inputs.defined() || !data_.targets.defined() || data_.inputs.size(0) != data_.targets.size(0))
      throw data_error("dataset inputs and targets must be defined and have the same number of samples");
  }
  std::int64_t size() const { return data_.inputs.size(0); }
  example get(std::int64_t i) const { return {data_.inputs[i], data_.targets[i]}; }
  batch gather(const torch::Tensor& indices) const {
    return {data_.inputs.index_select(0, indices), data_.targets.index_select(0, indices)};
  }
  // Consecutive rows as views, no copy (an unshuffled pass).
  batch slice(std::int64_t begin, std::int64_t end) const {
    return {data_.inputs.slice(0, begin, end), data_.targets.slice(0, begin, end)};
  }

 private:
  tensor_pair data_;
};

}  // namespace kiln::data

namespace kiln::detail {

// Stacks examples into one preallocated batch: the tensors of every example must have the shape
// and type of the first.
class collator {
 public:
  collator() = default;
  collator(std::int64_t batch_size, const data::example& first) {
    inputs_ = allocate(batch_size, first.input);
    targets_ = allocate(batch_size, first.target);
  }
  void put(std::int64_t row, std::int64_t sample, const data::example& e) {
    copy_row(inputs_, row, sample, e.input, "input");
    copy_row(targets_, row, sample, e.target, "target");
  }
  data::batch take() { return {std::move(inputs_), std::move(targets_)}; }

 private:
  static torch::Tensor allocate(std::int64_t batch_size, const torch::Tensor& like) {
    auto shape = like.sizes().vec();
    shape.insert(shape.begin(), batch_size);
    return torch::empty(shape, like.options());
  }
  static void copy_row(torch::Tensor& out, std::int64_t row, std::int64_t sample, const torch::Tensor& t,
                       const char* what) {
    if (t.sizes() != out.sizes().slice(1) || t.scalar_type() != out.scalar_type())
      throw data_error("sample " + std::to_string(sample) + ": its " + what + " has shape " + shape_text(t) + " " +
                       std::string(c10::toString(t.scalar_type())) + ", the batch's first has " +
                       shape_text(out[0]) + " " + std::string(c10::toString(out.scalar_type())));
    // One memcpy per row when the sample is contiguous on the CPU: a copy_ per sample would
    // cost a dispatch each.
    if (t.is_contiguous() && t.device().is_cpu() && out.device().is_cpu()) {
      const auto bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
      std::memcpy(static_cast<char*>(out.data_ptr()) + row * bytes, t.data_ptr(), bytes);
    } else {
      out[row].copy_(t);
    }
  }
  static std::string shape_text(const torch::Tensor& t) {
    std::string s = "[";
    for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
    return s + "]";
  }

  torch::Tensor inputs_, targets_;
};

}  // namespace kiln::detail

