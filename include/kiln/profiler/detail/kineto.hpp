// kiln/profiler/detail/kineto.hpp: LibTorch's Kineto profiler, where the build has it.
//
// Kineto (what torch.profiler uses) records operators and, on a GPU, CUDA kernels and memory
// copies when they execute, which RecordFunction callbacks on the CPU cannot see. Whether the
// LibTorch kiln links against was built with Kineto is invisible to a user's compiler
// (USE_KINETO is private to LibTorch's own build, and the headers declare the same API either
// way), so it is found out at run time, once per process: a Kineto session with nothing in it
// either saves a trace or throws. Debian's LibTorch 1.13 throws; PyTorch's 2.x wheels have it.
//
// Kineto keeps its state in the thread's one profiler slot (c10's PROFILER_STATE debug info),
// the slot kiln::memory_meter reports allocations through; LibTorch finds its profiler there
// without checking what it is. So a session starts only while that slot is free (slot_free()),
// and a meter refuses to start while a session records.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

namespace kiln::profiler::detail {

class kineto_session {
 public:
  // Whether nothing (a kiln::memory_meter, another profiler) holds this thread's profiler slot.
  static bool slot_free() { return c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr; }

  // True when this LibTorch can write a Kineto trace. The probe costs one empty session; call it
  // only while slot_free().
  static bool available() {
    static const bool answer = [] {
      const auto probe = std::filesystem::temp_directory_path() /
                         ("kiln-kineto-probe-" + std::to_string(::getpid()) + ".json");
      try {
        kineto_session session(/*record_shapes=*/false);
        session.save(probe);
      } catch (const std::exception&) {
        std::error_code ignored;
        std::filesystem::remove(probe, ignored);
        return false;
      }
      std::error_code ignored;
      std::filesystem::remove(probe, ignored);
      return true;
    }();
    return answer;
  }

  // Starts recording: operators on the CPU, and CUDA activity where a GPU is visible.
  explicit kineto_session(bool record_shapes) {
    if (!slot_free()) throw std::logic_error("a Kineto session while this thread's profiler slot is taken");
    namespace prof = torch::autograd::profiler;
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO, record_shapes);
    std::set<torch::profiler::impl::ActivityType> activities{torch::profiler::impl::ActivityType::CPU};
    if (torch::cuda::is_available()) activities.insert(torch::profiler::impl::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    running_ = true;
  }
  kineto_session(const kineto_session&) = delete;
  kineto_session& operator=(const kineto_session&) = delete;
  ~kineto_session() {
    if (!running_) return;
    try {
      torch::autograd::profiler::disableProfiler();
    } catch (const std::exception&) {  // unwinding: the session is over either way
    }
  }

  // Stops recording and writes the Chrome trace Kineto made.
  void save(const std::filesystem::path& file) {
    running_ = false;
    auto result = torch::autograd::profiler::disableProfiler();
    result->save(file.string());
  }

 private:
  bool running_ = false;
};

}  // namespace kiln::profiler::detail
