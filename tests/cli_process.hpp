// tests/cli_process.hpp: the kiln command line as a subprocess, for the tests that check what a
// user sees (its output and exit status), not what the library returns.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

#include <sys/wait.h>

#include "text_checks.hpp"

namespace kiln::test {

struct cli_result {
  int status = -1;     // exit status; -1 when the process did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs `CLI ARGS` from the source tree (so recipes/... paths work), with OMP_WAIT_POLICY set so
// that the CLI does not re-execute itself to set it. `cli` is the tests' build of the kiln
// binary unless a test brings its own (the distributed tests' CLI with test-only recipes).
inline cli_result kiln_cli(const std::string& args, const std::string& cli = KILN_CLI) {
  const std::string command =
      "cd '" KILN_SOURCE_DIR "' && OMP_WAIT_POLICY=PASSIVE '" + cli + "' " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot start: " + command);
  cli_result result;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace kiln::test
