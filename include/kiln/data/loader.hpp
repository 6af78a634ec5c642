// kiln/data/loader.hpp: batches from an in-memory dataset, reshuffled each epoch, with a
// position that can be saved and restored exactly.
//
// The order of epoch e is a pure function of (seed, e): a resumed run that restores
// {epoch, batch} sees the very batches an uninterrupted run would have seen, without
// replaying the epoch. Shuffling uses its own generator, never the global one, so it does not
// shift dropout masks either.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>

#include <torch/torch.h>

#include "kiln/data/tensor_pair.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"

namespace kiln::data {

struct batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

struct loader_options {
  std::int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = true;  // a short last batch would change the gradient scale of one step
  std::uint64_t seed = 0;
  double delay_ms = 0;  // simulated input latency per batch (a slow input pipeline, for profiling)
};

class batch_loader {
 public:
  batch_loader(tensor_pair data, loader_options options) : data_(std::move(data)), options_(options) {
    if (!data_.inputs.defined() || !data_.targets.defined() || data_.inputs.size(0) != data_.targets.size(0))
      throw data_error("dataset inputs and targets must be defined and have the same number of samples");
    if (options_.batch_size <= 0) throw data_error("batch size must be > 0");
    size_ = data_.inputs.size(0);
    if (batches_per_epoch() == 0)
      throw data_error("the dataset has " + std::to_string(size_) + " samples, fewer than one batch of " +
                       std::to_string(options_.batch_size));
    start_epoch();
  }

  std::int64_t samples() const { return size_; }
  std::int64_t batches_per_epoch() const {
    return options_.drop_last ? size_ / options_.batch_size
                              : (size_ + options_.batch_size - 1) / options_.batch_size;
  }
  std::int64_t epoch() const { return epoch_; }
  std::int64_t batch_in_epoch() const { return index_; }
  // Batches next() returns before the next epoch starts (0 right at an epoch's end).
  std::int64_t batches_left_in_epoch() const { return batches_per_epoch() - index_; }
  // Ends the current epoch: the next batch is the first of the next one.
  void skip_rest_of_epoch() { index_ = batches_per_epoch(); }

  // The next batch; rolls over into the next epoch (and its new order) at the end of one.
  batch next() {
    if (index_ == batches_per_epoch()) {
      ++epoch_;
      index_ = 0;
      start_epoch();
    }
    if (options_.delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options_.delay_ms));
    const auto begin = index_ * options_.batch_size;
    const auto end = std::min(begin + options_.batch_size, size_);
    ++index_;
    if (!options_.shuffle) return {data_.inputs.slice(0, begin, end), data_.targets.slice(0, begin, end)};
    auto idx = order_.slice(0, begin, end);
    return {data_.inputs.index_select(0, idx), data_.targets.index_select(0, idx)};
  }

  void save_state(state_dict& state, const std::string& prefix) const {
    state[prefix + "epoch"] = scalar_tensor(epoch_);
    state[prefix + "batch"] = scalar_tensor(index_);
  }
  void load_state(const state_dict& state, const std::string& prefix) {
    epoch_ = require(state, prefix + "epoch").item<std::int64_t>();
    index_ = require(state, prefix + "batch").item<std::int64_t>();
    start_epoch();
  }

 private:
  void start_epoch() {
    if (!options_.shuffle) return;
    // A fresh generator per epoch: the order depends on (seed, epoch) only.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed * 1000003ULL + static_cast<std::uint64_t>(epoch_));
    order_ = torch::randperm(size_, gen, torch::kInt64);
  }

  tensor_pair data_;
  loader_options options_;
  std::int64_t size_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t index_ = 0;
  torch::Tensor order_;
};

}  // namespace kiln::data
