// kiln/host_memory.hpp: keep a training step's freed CPU memory for the next step.
//
// LibTorch's CPU allocator is glibc's malloc. By default glibc serves each block of 128 KiB or
// more (activations, gradients) with its own mmap and unmaps it when it is freed, and trims the
// heap top, so every step faults the same pages in again (and the kernel zero-fills them): the
// mixed-precision recipe's fp32 step ran about 1.5x (Debian 12) to 2x (Debian 13) slower that way
// (README.md, "Mixed precision"). Serving blocks below 256 MiB from the heap and keeping up to
// 512 MiB free at its top lets the next step reuse them; the process's resident size stays near
// the step's peak instead. The kiln CLI calls this at start; a program of your own can call it
// before it trains. It changes the whole process's malloc, which is why the library never calls
// it behind your back.
#pragma once

#include <cstdlib>
#include <cstring>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace kiln {

// The two settings, as glibc's tunables name them: bench/environment gives every process of a
// benchmark (kiln, hand-written LibTorch, Python) the same through GLIBC_TUNABLES.
inline constexpr std::size_t step_memory_mmap_threshold = std::size_t{256} << 20;
inline constexpr std::size_t step_memory_trim_threshold = std::size_t{512} << 20;

// Returns whether it changed anything: not where the C library is not glibc, and not when the
// user's own GLIBC_TUNABLES has a malloc setting (theirs wins).
inline bool keep_freed_step_memory() {
  if (const char* tunables = std::getenv("GLIBC_TUNABLES"); tunables && std::strstr(tunables, "glibc.malloc.")) return false;
#ifdef __GLIBC__
  return ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(step_memory_mmap_threshold)) == 1 &&
         ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(step_memory_trim_threshold)) == 1;
#else
  return false;
#endif
}

}  // namespace kiln
