// kiln/data/tensor_pair.hpp: a whole dataset held as two tensors.
//
// Every in-memory data source (Fashion-MNIST, the synthetic generators) returns this, so the
// batching code needs to know only one shape: row i of inputs goes with row i of targets.
#pragma once

#include <torch/torch.h>

namespace kiln::data {

struct tensor_pair {
  torch::Tensor inputs;
  torch::Tensor targets;
};

}  // namespace kiln::data
