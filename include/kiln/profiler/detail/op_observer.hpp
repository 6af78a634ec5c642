// kiln/profiler/detail/op_observer.hpp: one RecordFunction callback shared by the profilers
// that look at LibTorch's operators (ops, trace).
//
// ATen calls RecordFunction callbacks around every operator and autograd function. They are
// plain function pointers, so the observer is a process-wide singleton that forwards each
// finished op (name, start, duration, self time) to the sinks registered with it. A callback
// is installed only while at least one sink is registered: a profiler that is off costs nothing.
// Self time is total time minus the time of ops started inside it on the same thread.
#pragma once

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::profiler::detail {

struct op_event {
  std::string name;
  std::string shapes;  // "[[128, 784], [256, 784]]" when a sink asked for shapes
  double start_us = 0;
  double duration_us = 0;
  double self_us = 0;
  std::uint64_t thread = 0;
  bool backward = false;  // an autograd function (e.g. AddmmBackward0)
};

class op_observer;

// A collector of operator events. observe(true) registers it with the observer (installing the
// callback if it is the first), observe(false) unregisters it; both are idempotent.
class op_sink {
 public:
  virtual ~op_sink() = default;
  virtual void on_op(const op_event&) = 0;

 protected:
  inline void observe(bool on, bool shapes);

 private:
  bool observing_ = false;
};

inline double now_us() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch).count();
}

inline std::uint64_t thread_number() {
  static std::atomic<std::uint64_t> next{1};
  thread_local const std::uint64_t mine = next++;
  return mine;
}

class op_observer {
 public:
  static op_observer& instance() {
    static op_observer observer;
    return observer;
  }

  void add(op_sink* sink, bool shapes) {
    std::lock_guard lock(mutex_);
    sinks_.push_back(sink);
    shapes_ = shapes_ || shapes;
    if (handle_ == 0) {
      handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                          .needsInputs(shapes_)
                                          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    }
  }

  void remove(op_sink* sink) {
    std::lock_guard lock(mutex_);
    sinks_.erase(std::remove(sinks_.begin(), sinks_.end(), sink), sinks_.end());
    if (sinks_.empty() && handle_ != 0) {
      at::removeCallback(handle_);
      handle_ = 0;
      shapes_ = false;
    }
  }

 private:
  struct context : at::ObserverContext {
    std::string name, shapes;
    double start_us = 0, children_us = 0;
    bool backward = false;
    context* parent = nullptr;
  };

  static context*& innermost() {
    thread_local context* top = nullptr;
    return top;
  }

  static std::string shapes_of(const at::RecordFunction& fn) {
#ifndef NDEBUG
    // Debian's LibTorch is built with NDEBUG, but inputs() in a header compiled without it
    // checks a flag that the library never sets, and throws at random: no shapes in such builds.
    (void)fn;
    return "[shapes need an NDEBUG build]";
#endif
    std::string text = "[";
    bool first = true;
    for (const auto& input : fn.inputs()) {
      if (!first) text += ", ";
      first = false;
      if (input.isTensor()) text += c10::str(input.toTensor().sizes());
      else text += "[]";
    }
    return text + "]";
  }

  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    auto ctx = std::make_unique<context>();
    ctx->name = std::string(fn.name());
    ctx->backward = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
    if (instance().shapes_) ctx->shapes = shapes_of(fn);
    ctx->parent = innermost();
    innermost() = ctx.get();
    ctx->start_us = now_us();
    return ctx;
  }

  static void on_end(const at::RecordFunction&, at::ObserverContext* base) {
    const double end = now_us();
    auto* ctx = static_cast<context*>(base);
    if (!ctx) return;
    const double duration = end - ctx->start_us;
    if (ctx->parent) ctx->parent->children_us += duration;
    if (innermost() == ctx) innermost() = ctx->parent;
    op_event event{ctx->name, ctx->shapes, ctx->start_us, duration, duration - ctx->children_us, thread_number(),
                   ctx->backward};
    auto& self = instance();
    std::lock_guard lock(self.mutex_);
    for (auto* sink : self.sinks_) sink->on_op(event);
  }

  std::mutex mutex_;
  std::vector<op_sink*> sinks_;
  at::CallbackHandle handle_ = 0;
  bool shapes_ = false;
};

inline void op_sink::observe(bool on, bool shapes) {
  if (on == observing_) return;
  observing_ = on;
  if (on) op_observer::instance().add(this, shapes);
  else op_observer::instance().remove(this);
}

}  // namespace kiln::profiler::detail
