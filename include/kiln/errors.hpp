// kiln/errors.hpp: the exceptions kiln throws for bad input.
//
// Each names its cause and where it is (file:line for a recipe, the path for data), so the
// CLI can print e.what() and exit without a stack trace. This header does not depend on LibTorch.
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

// Base of every kiln error: catch this to catch them all.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A recipe or settings value is wrong: unknown key, wrong type, out of range,
// or a policy combination that this binary does not contain.
struct config_error : error {
  using error::error;
};

// A dataset file is missing, truncated or not what it claims to be.
struct data_error : error {
  using error::error;
};

// A saved state cannot be read back or does not fit the model it is loaded into.
struct state_error : error {
  using error::error;
};

// Joining the process group or a collective failed: a peer exited (Gloo notices the closed
// connection at once), a peer stopped answering or never started (noticed when the timeout
// expires), or the collective's arguments were wrong. After a peer has failed, every later
// collective of the group fails too: the job has to be restarted.
struct distributed_error : error {
  using error::error;
};

// A training step failed inside the model, the loss or LibTorch (a shape or dtype mismatch, an
// op this build lacks): the message names the step, the micro-batch and the phase, then
// LibTorch's own message without its C++ backtrace.
struct step_error : error {
  using error::error;
};

}  // namespace kiln
