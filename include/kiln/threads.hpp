// kiln/threads.hpp: how many threads a training step runs on, on a machine it may share.
//
//   kiln::thread_budget budget(0);   // 0: the cores nothing else wants, re-checked as the run goes
//   ... after each optimizer step: budget.between_steps();
//
// A step's parallel work is split evenly over its threads, so it ends when the slowest thread
// ends. On a machine whose cores other processes also want (a build, a second run, more DDP
// ranks than cores), a thread that loses its core holds up the whole step until the scheduler
// gives it one back, and OpenBLAS's own pthreads (Debian's build; it splits every GEMM over
// all cores) do the same inside every matmul. Measured on an AMD EPYC with 2 cores and 2 busy
// processes (bench/run_contention): the quickstart step took 44x its idle time with 2 LibTorch
// and 2 OpenBLAS threads, 5-45x (12-113 ms a step) with 1 and 2, and 1.7-2.6x with 1 and 1;
// on an idle machine 2 and 2 was the fastest. So kiln runs as many threads as there are cores
// that nothing else is running on, for LibTorch and OpenBLAS alike, and looks again every few
// steps:
// /proc/stat's procs_running counts the machine's runnable tasks, less this process's own
// (its threads in state R, OpenBLAS's spinning ones included). The median of the last few
// looks decides, so a short-lived task does not move it.
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include <ATen/Parallel.h>

namespace kiln {

namespace detail {

// Tasks in state R on the whole machine (the reader counts itself), or -1 where unknown.
inline int runnable_tasks() {
  std::ifstream in("/proc/stat");
  std::string key;
  while (in >> key) {
    if (key == "procs_running") {
      int n = -1;
      in >> n;
      return n;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}

// This process's threads in state R (the caller included).
inline int own_runnable_threads() {
  int running = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');  // the name may hold spaces and parentheses
    if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'R') ++running;
  }
  return std::max(running, 1);
}

// OpenBLAS's thread count, where OpenBLAS is the BLAS in this process (found at run time: kiln
// does not link it). Returns false where it is not.
inline bool set_openblas_threads(int n) {
  using set_fn = void (*)(int);
  static const auto set = reinterpret_cast<set_fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!set) return false;
  set(n);
  return true;
}

}  // namespace detail

// LibTorch's OpenMP threads and OpenBLAS's own threads share the cores: with libgomp's default
// (active) waiting, OpenMP's workers spin after each parallel region while the next GEMM wants
// their cores (docs/threads.md, "The OpenMP wait policy"). libgomp reads
// OMP_WAIT_POLICY when it loads, before main(), so this sets it and re-executes the program
// once: call it first thing in main(). An explicit OMP_WAIT_POLICY is left alone; where the
// re-execution fails, the program runs on as it is.
inline void ensure_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::execv("/proc/self/exe", argv);
}

// Cores that tasks of other processes are running on right now (0 where /proc says nothing).
inline int cores_busy_elsewhere() {
  const int all = detail::runnable_tasks();
  return all < 0 ? 0 : std::max(0, all - detail::own_runnable_threads());
}

class thread_budget {
 public:
  // fixed > 0: that many threads for LibTorch and OpenBLAS, always. 0: adaptive (above).
  explicit thread_budget(int fixed = 0, int cores = static_cast<int>(std::thread::hardware_concurrency()))
      : cores_(std::max(cores, 1)), adaptive_(fixed <= 0) {
    apply(adaptive_ ? std::max(1, cores_ - cores_busy_elsewhere()) : fixed);
    looks_.fill(cores_ - threads_);
  }

  // Between optimizer steps (no parallel region is running): every `interval` it looks at the
  // machine again and follows the median of the last looks.
  void between_steps() {
    if (!adaptive_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_look_ < interval) return;
    last_look_ = now;
    looks_[next_++ % looks_.size()] = cores_busy_elsewhere();
    auto sorted = looks_;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const int wanted = std::clamp(cores_ - sorted[sorted.size() / 2], 1, cores_);
    if (wanted != threads_) apply(wanted), ++changes_;
  }

  int threads() const { return threads_; }
  std::int64_t changes() const { return changes_; }
  bool adaptive() const { return adaptive_; }

  static constexpr std::chrono::milliseconds interval{50};

 private:
  void apply(int n) {
    threads_ = n;
    at::set_num_threads(n);
    detail::set_openblas_threads(n);
  }

  int cores_;
  bool adaptive_;
  int threads_ = 1;
  std::int64_t changes_ = 0;
  std::array<int, 5> looks_{};
  std::size_t next_ = 0;
  std::chrono::steady_clock::time_point last_look_ = std::chrono::steady_clock::now();
};

}  // namespace kiln
