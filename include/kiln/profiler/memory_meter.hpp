// kiln/profiler/memory_meter.hpp: bytes allocated by LibTorch while a meter runs, and their peak.
//
//   kiln::memory_meter meter;
//   meter.start();
//   auto y = model->forward(x);             // activations
//   std::int64_t activation_bytes = meter.peak();
//
// The meter registers itself as the profiler's memory-reporting hook (c10's
// MemoryReportingInfoBase in the thread-local debug info), which LibTorch's CPU allocator and
// CUDA caching allocator call on every allocation and free. The hook travels with the thread
// state into autograd's and intra-op worker threads, so backward's allocations count too.
// On the CPU, bytes are the sizes tensors asked for, so a known allocation pattern is counted to
// the byte; the CUDA caching allocator reports the blocks it hands out, which it rounds up to
// multiples of 512 bytes (and may give larger when it reuses a cached block).
// Used by the `memory` profiler and by anyone measuring activation memory.
//
// LibTorch has one such hook per thread, which its own profiler (Kineto) uses too: a meter
// started inside another meter counts into both, and one started while Kineto records on this
// thread is refused, as the two cannot share the hook.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

namespace kiln {

namespace detail {

struct memory_counter : c10::MemoryReportingInfoBase, std::enable_shared_from_this<memory_counter> {
  explicit memory_counter(std::shared_ptr<memory_counter> enclosing) : outer(std::move(enclosing)) {}
  std::shared_ptr<memory_counter> outer;  // the meter that was running when this one started
  std::atomic<std::int64_t> current{0};
  std::atomic<std::int64_t> peak{0};
  std::atomic<std::int64_t> allocations{0};

  void add(std::int64_t bytes) {
    const auto now = current.fetch_add(bytes) + bytes;
    if (bytes > 0) ++allocations;
    auto seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    if (outer) outer->add(bytes);
  }
  // LibTorch 1.13 passes the totals as int64_t, 2.x as size_t: implement both, one overrides.
  void reportMemoryUsage(void*, int64_t alloc_size, int64_t, int64_t, c10::Device) { add(alloc_size); }
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device) { add(alloc_size); }
  bool memoryProfilingEnabled() const override { return true; }
};

}  // namespace detail

class memory_meter {
 public:
  // Frees of blocks allocated before start() are not counted (the CPU allocator does not know
  // their size then; LibTorch logs one warning per thousand of them).
  memory_meter() = default;
  memory_meter(const memory_meter&) = delete;
  memory_meter& operator=(const memory_meter&) = delete;

  // Starts counting on this thread (and the threads its work spawns). Counts start at zero.
  // Throws std::logic_error while LibTorch's profiler records on this thread.
  void start() {
    std::shared_ptr<detail::memory_counter> outer;
    if (auto* holder = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE)) {
      auto* meter = dynamic_cast<detail::memory_counter*>(holder);
      if (meter == nullptr)
        throw std::logic_error(
            "kiln::memory_meter: LibTorch's profiler (Kineto) is recording on this thread and holds the one "
            "memory-reporting hook LibTorch has; stop it before starting a meter");
      outer = meter->shared_from_this();
    }
    counter_ = std::make_shared<detail::memory_counter>(std::move(outer));
    guard_ = std::make_unique<c10::DebugInfoGuard>(c10::DebugInfoKind::PROFILER_STATE, counter_);
  }
  void stop() { guard_.reset(); }
  bool running() const { return guard_ != nullptr; }

  // Bytes allocated since start() and not yet freed (negative when more was freed than allocated).
  std::int64_t current() const { return counter_ ? counter_->current.load() : 0; }
  // The highest current() since start() or the last reset_peak().
  std::int64_t peak() const { return counter_ ? counter_->peak.load() : 0; }
  std::int64_t allocations() const { return counter_ ? counter_->allocations.load() : 0; }
  void reset_peak() {
    if (counter_) counter_->peak.store(counter_->current.load());
  }

 private:
  std::shared_ptr<detail::memory_counter> counter_;
  std::unique_ptr<c10::DebugInfoGuard> guard_;
};

}  // namespace kiln
