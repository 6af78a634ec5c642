// kiln/data/loader.hpp: batches from any dataset (kiln/data/dataset.hpp), reshuffled each
// epoch, made ahead of time by worker threads, sharded across ranks, with a position that can be
// saved and restored exactly.
//
// Determinism: batch b of epoch e is a pure function of (seed, e, b): its samples come from the
// epoch's order (a fresh generator seeded by (seed, e), never the global one, so shuffling does
// not shift dropout masks), and each sample's transform draws from a generator seeded by
// (seed, e, its position in the epoch). So the sequence of batches is the same for any number of
// workers, and a resumed run that restores {epoch, batch} sees the very batches an
// uninterrupted run would have seen, without replaying the epoch.
//
// Workers: with workers = N > 0, N threads make batches in order of their number, at most
// `prefetch` (or N, if larger) ahead of the one the training thread is consuming, and next()
// hands them out in order. An error in a worker (a dataset's get, a transform) is caught with
// the sample's index and rethrown by next() in the training thread; the destructor stops and
// joins the workers. workers = 0 makes each batch in next() itself.
//
// Distributed: with world > 1 each rank takes every world-th sample of the epoch's order,
// starting at its rank (as torch's DistributedSampler), after padding the order with its own
// first samples to a multiple of world (pad_shards) or cutting it to one: every rank then has the
// same number of samples and batches, and the ranks' shards are disjoint (padding aside).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kiln/data/dataset.hpp"
#include "kiln/data/tensor_pair.hpp"
#include "kiln/data/transforms.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"

namespace kiln::data {

struct loader_options {
  std::int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = true;  // a short last batch would change the gradient scale of one step
  std::uint64_t seed = 0;
  double delay_ms = 0;        // simulated input latency per batch (a slow input pipeline, for profiling)
  std::int64_t workers = 0;   // threads making batches ahead; 0: next() makes each batch itself
  std::int64_t prefetch = 2;  // batches made ahead of the one being consumed (at least `workers`)
  std::int64_t rank = 0;      // this process's shard of each epoch ...
  std::int64_t world = 1;     // ... out of `world`
  bool pad_shards = true;     // pad the epoch to a multiple of world (true) or cut it (false)
  // Batches in page-locked host memory, which a CUDA device copies from asynchronously; the
  // copy into it happens where the batch is made (a worker, when there are workers). CUDA only.
  bool pin_memory = false;
};

// Samples each rank sees per epoch: all of them in one process, else the epoch padded or cut to
// a multiple of world, divided by world.
inline std::int64_t shard_samples(std::int64_t samples, const loader_options& o) {
  if (o.world == 1) return samples;
  return o.pad_shards ? (samples + o.world - 1) / o.world : samples / o.world;
}

// The samples rank `rank` sees in `epoch`, in order: the epoch's order (shuffled by
// (seed, epoch) or not), padded or cut to a multiple of world, every world-th from `rank`.
inline torch::Tensor epoch_samples(std::int64_t samples, std::int64_t epoch, const loader_options& o) {
  torch::Tensor order;
  if (o.shuffle) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed * 1000003ULL + static_cast<std::uint64_t>(epoch));
    order = torch::randperm(samples, gen, torch::kInt64);
  } else {
    order = torch::arange(samples, torch::kInt64);
  }
  if (o.world == 1) return order;
  const auto total = shard_samples(samples, o) * o.world;
  if (total > samples) order = order.repeat({(total + samples - 1) / samples});
  return order.slice(0, o.rank, total, o.world).contiguous();  // read through data_ptr by the loader
}

}  // namespace kiln::data

namespace kiln::detail {

// What makes batches: the dataset, the options, the transform and the workers, held by the
// loader through a pointer so that a loader can move while its workers keep theirs.
template <data::dataset Dataset, data::transform Transform>
class batch_maker {
 public:
  batch_maker(Dataset data, data::loader_options options, Transform transform)
      : data_(std::move(data)), options_(options), transform_(std::move(transform)) {
    const auto& o = options_;
    if (o.batch_size <= 0) throw data_error("batch size must be > 0");
    if (o.workers < 0) throw data_error("workers must be >= 0, got " + std::to_string(o.workers));
    if (o.prefetch < 1) throw data_error("prefetch must be >= 1 batch, got " + std::to_string(o.prefetch));
    if (o.pin_memory && !torch::cuda::is_available())
      throw data_error("pin_memory: page-locked batches are for copies to a CUDA device, and this process has none");
    if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
      throw data_error("rank " + std::to_string(o.rank) + " is not one of world = " + std::to_string(o.world));
    size_ = data::shard_samples(static_cast<std::int64_t>(data_.size()), o);
    batches_per_epoch_ = o.drop_last ? size_ / o.batch_size : (size_ + o.batch_size - 1) / o.batch_size;
    if (batches_per_epoch_ == 0)
      throw data_error("the dataset has " + std::to_string(size_) + " samples" + (o.world > 1 ? " per rank" : "") +
                       ", fewer than one batch of " + std::to_string(o.batch_size));
  }
  batch_maker(const batch_maker&) = delete;
  batch_maker& operator=(const batch_maker&) = delete;
  ~batch_maker() { stop_workers(); }

  std::int64_t samples() const { return size_; }
  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }

  // Batch `number` (batch b of epoch e is e * batches_per_epoch() + b): made here, or taken from
  // the workers, which are started at the first request.
  data::batch get(std::int64_t number) {
    if (options_.workers == 0) return make(number);
    std::unique_lock lock(mutex_);
    if (workers_.empty()) start_workers(number);
    if (number != consumed_) restart(number);
    ready_changed_.wait(lock, [&] { return ready_.count(number) > 0; });
    auto result = std::move(ready_[number]);
    ready_.erase(number);
    consumed_ = number + 1;
    lock.unlock();
    wanted_changed_.notify_all();
    if (result.error) std::rethrow_exception(result.error);
    return std::move(result.value);
  }

 private:
  // Batch `number`, from nothing but (seed, its epoch, its index): any thread may make any batch.
  data::batch make(std::int64_t number) const {
    auto b = assemble(number);
    if (options_.pin_memory) b = {b.inputs.pin_memory(), b.targets.pin_memory()};
    return b;
  }
  data::batch assemble(std::int64_t number) const {
    const auto epoch = number / batches_per_epoch_, index = number % batches_per_epoch_;
    if (options_.delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options_.delay_ms));
    const auto begin = index * options_.batch_size, end = std::min(begin + options_.batch_size, size_);
    constexpr bool whole_batches = std::is_same_v<Transform, data::no_transform> && data::gathers_batches<Dataset>;
    if constexpr (whole_batches && requires(const Dataset& d) { d.slice(0, 1); }) {
      if (!options_.shuffle && options_.world == 1) return data_.slice(begin, end);
    }
    const auto indices = samples_of(epoch).slice(0, begin, end);
    if constexpr (whole_batches) {
      return data_.gather(indices);
    } else {
      const auto* index_of = indices.template data_ptr<std::int64_t>();
      kiln::detail::collator out;
      for (std::int64_t k = 0; k < end - begin; ++k) {
        const auto sample = index_of[k];
        try {
          data::example e = data_.get(sample);
          data::sample_rng rng(options_.seed, static_cast<std::uint64_t>(epoch),
                               static_cast<std::uint64_t>(begin + k), static_cast<std::uint64_t>(options_.rank));
          transform_(e, rng);
          if (k == 0) out = kiln::detail::collator(end - begin, e);
          out.put(k, sample, e);
        } catch (const data_error&) {
          throw;
        } catch (const std::exception& error) {
          throw data_error("sample " + std::to_string(sample) + " (epoch " + std::to_string(epoch) + ", batch " +
                           std::to_string(index) + "): " + error.what());
        }
      }
      return out.take();
    }
  }

  // The epoch's samples for this rank; workers near an epoch's end need two epochs at once.
  torch::Tensor samples_of(std::int64_t epoch) const {
    std::lock_guard lock(orders_mutex_);
    auto found = orders_.find(epoch);
    if (found != orders_.end()) return found->second;
    while (orders_.size() >= 3) orders_.erase(orders_.begin());
    return orders_[epoch] = data::epoch_samples(static_cast<std::int64_t>(data_.size()), epoch, options_);
  }

  struct made {
    data::batch value;
    std::exception_ptr error;
  };

  void start_workers(std::int64_t from) {
    consumed_ = next_to_make_ = from;
    for (std::int64_t w = 0; w < options_.workers; ++w) workers_.emplace_back([this] { work(); });
  }

  void work() {
    const auto ahead = std::max(options_.prefetch, options_.workers);
    std::unique_lock lock(mutex_);
    while (true) {
      wanted_changed_.wait(lock, [&] { return stopping_ || next_to_make_ < consumed_ + ahead; });
      if (stopping_) return;
      const auto number = next_to_make_++;
      const auto generation = generation_;
      lock.unlock();
      made result;
      try {
        result.value = make(number);
      } catch (...) {
        result.error = std::current_exception();
      }
      lock.lock();
      if (generation == generation_) ready_[number] = std::move(result);  // else made for a position since left
      ready_changed_.notify_all();
    }
  }

  // The consumer moved (a resume, a skipped epoch end): what was made for the old position goes.
  // Called with mutex_ held.
  void restart(std::int64_t number) {
    ++generation_;
    ready_.clear();
    consumed_ = next_to_make_ = number;
    wanted_changed_.notify_all();
  }

  void stop_workers() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wanted_changed_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  Dataset data_;
  data::loader_options options_;
  Transform transform_;
  std::int64_t size_ = 0, batches_per_epoch_ = 0;

  mutable std::mutex orders_mutex_;
  mutable std::map<std::int64_t, torch::Tensor> orders_;

  std::mutex mutex_;
  std::condition_variable ready_changed_, wanted_changed_;
  std::map<std::int64_t, made> ready_;
  std::int64_t consumed_ = 0, next_to_make_ = 0, generation_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kiln::detail

namespace kiln::data {

template <dataset Dataset, transform Transform = no_transform>
class loader {
 public:
  loader(Dataset data, loader_options options, Transform transform = {})
      : maker_(std::make_unique<kiln::detail::batch_maker<Dataset, Transform>>(std::move(data), options,
                                                                         std::move(transform))) {}

  // Samples this rank sees per epoch.
  std::int64_t samples() const { return maker_->samples(); }
  std::int64_t batches_per_epoch() const { return maker_->batches_per_epoch(); }
  std::int64_t epoch() const { return epoch_; }
  std::int64_t batch_in_epoch() const { return index_; }
  // Batches next() returns before the next epoch starts (0 right at an epoch's end).
  std::int64_t batches_left_in_epoch() const { return batches_per_epoch() - index_; }
  // Ends the current epoch: the next batch is the first of the next one.
  void skip_rest_of_epoch() { index_ = batches_per_epoch(); }

  // The next batch; rolls over into the next epoch (and its new order) at the end of one.
  batch next() {
    if (index_ == batches_per_epoch()) ++epoch_, index_ = 0;
    const auto number = epoch_ * batches_per_epoch() + index_;
    ++index_;
    return maker_->get(number);
  }

  void save_state(state_dict& state, const std::string& prefix) const {
    state[prefix + "epoch"] = scalar_tensor(epoch_);
    state[prefix + "batch"] = scalar_tensor(index_);
  }
  void load_state(const state_dict& state, const std::string& prefix) {
    epoch_ = require(state, prefix + "epoch").item<std::int64_t>();
    index_ = require(state, prefix + "batch").item<std::int64_t>();
  }

 private:
  std::unique_ptr<kiln::detail::batch_maker<Dataset, Transform>> maker_;
  std::int64_t epoch_ = 0;
  std::int64_t index_ = 0;
};

template <dataset D>
loader(D, loader_options) -> loader<D>;
template <dataset D, transform T>
loader(D, loader_options, T) -> loader<D, T>;
template <transform T>
loader(tensor_pair, loader_options, T) -> loader<in_memory, T>;

// The loader over a dataset held in memory, as the recipes' data sets are.
using batch_loader = loader<in_memory>;

// What the trainer needs from a loader.
template <class L>
concept batch_source = requires(L& l, const L& cl, state_dict& state, const state_dict& cstate) {
  { l.next() } -> std::same_as<batch>;
  { cl.batches_per_epoch() } -> std::convertible_to<std::int64_t>;
  { cl.batches_left_in_epoch() } -> std::convertible_to<std::int64_t>;
  { cl.epoch() } -> std::convertible_to<std::int64_t>;
  { cl.samples() } -> std::convertible_to<std::int64_t>;
  l.skip_rest_of_epoch();
  cl.save_state(state, std::string());
  l.load_state(cstate, std::string());
};

}  // namespace kiln::data
