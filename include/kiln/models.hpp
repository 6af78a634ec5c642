// kiln/models.hpp: kiln's models (mlp, cnn, gpt) and the layers they are built from, whose
// kernels are kiln's own (linear, layer norm, GELU, dropout, cross-entropy).
#pragma once

#include "kiln/kiln.hpp"

#include "kiln/models/cnn.hpp"
#include "kiln/models/cross_entropy.hpp"
#include "kiln/models/dropout.hpp"
#include "kiln/models/gelu.hpp"
#include "kiln/models/gpt.hpp"
#include "kiln/models/layer_norm.hpp"
#include "kiln/models/linear.hpp"
#include "kiln/models/mlp.hpp"
