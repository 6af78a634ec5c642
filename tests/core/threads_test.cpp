// kiln::thread_budget: a fixed count reaches LibTorch and OpenBLAS; the adaptive one gives up a
// core to a process that keeps one busy. Real processes, no mocks: the machine may carry other
// load (ctest runs two tests at once), so the checks hold whatever else is running.
#include <kiln/kiln.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

int openblas_threads() {
  using get_fn = int (*)();
  static const auto get = reinterpret_cast<get_fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : -1;
}

// LibTorch's and OpenBLAS's thread counts, put back when the test ends.
struct restore_threads {
  int torch = at::get_num_threads(), blas = openblas_threads();
  ~restore_threads() {
    at::set_num_threads(torch);
    if (blas > 0) kiln::detail::set_openblas_threads(blas);
  }
};

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("a fixed thread count is LibTorch's and OpenBLAS's, and stays") {
    restore_threads restore;
    kiln::thread_budget budget(3);
    CHECK(at::get_num_threads() == 3);
    if (openblas_threads() > 0) CHECK(openblas_threads() == 3);
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(kiln::thread_budget::interval);
      budget.between_steps();
    }
    CHECK(budget.threads() == 3);
    CHECK(budget.changes() == 0);
  }

  TEST_CASE("adaptive: a process that keeps a core busy gets that core") {
    restore_threads restore;
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    // A child process that spins: a core busy elsewhere.
    const pid_t spinner = ::fork();
    REQUIRE(spinner >= 0);
    if (spinner == 0) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);  // ends by itself
      while (std::chrono::steady_clock::now() < end) {
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(kiln::cores_busy_elsewhere() >= 1);
    kiln::thread_budget budget(0, cores);
    for (int i = 0; i < 8; ++i) {  // more looks than the median spans
      std::this_thread::sleep_for(kiln::thread_budget::interval);
      budget.between_steps();
    }
    CHECK(budget.threads() <= std::max(1, cores - 1));
    CHECK(at::get_num_threads() == budget.threads());
    if (openblas_threads() > 0) CHECK(openblas_threads() == budget.threads());
    ::kill(spinner, SIGKILL);
    ::waitpid(spinner, nullptr, 0);
  }
}
