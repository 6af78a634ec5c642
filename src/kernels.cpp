// kiln::kernels: the entry points of kiln's CPU kernels, compiled once (kiln/detail/kernels.hpp
// says why). Linked by the CMake target kiln::kiln, whose users define KILN_SEPARATE_KERNELS and
// so only see the declarations.
#ifndef KILN_SEPARATE_KERNELS
#define KILN_SEPARATE_KERNELS
#endif
#define KILN_COMPILING_KERNELS
#include "kiln/models/cross_entropy.hpp"
#include "kiln/models/dropout.hpp"
#include "kiln/models/gelu.hpp"
#include "kiln/models/layer_norm.hpp"
#include "kiln/optim/adafactor.hpp"
#include "kiln/optim/adam8bit.hpp"
#include "kiln/optim/adamw.hpp"
#include "kiln/optim/lion.hpp"
