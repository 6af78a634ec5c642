// kiln/kiln.hpp: the one public include of kiln.
//
// kiln turns a LibTorch model into a training run from policies that compose at compile time:
//   kiln::trainer<kiln::optim::adamw>           kiln owns the loop (fit, evaluate, resume)
//   kiln::accelerator<kiln::optim::adamw>       you own the loop (prepare, backward, step)
// and from TOML recipes that pick the policies (kiln/recipe/recipe.hpp).
#pragma once

#include "kiln/detail/torch.hpp"  // first: see there
#include "kiln/version.hpp"

#include "kiln/concepts.hpp"
#include "kiln/errors.hpp"
#include "kiln/policies.hpp"

#include "kiln/accumulation/steps.hpp"
#include "kiln/checkpointing/blocks.hpp"
#include "kiln/checkpointing/checkpoint.hpp"
#include "kiln/checkpointing/every_nth.hpp"
#include "kiln/checkpointing/none.hpp"
#include "kiln/checkpointing/selective.hpp"
#include "kiln/optim/adafactor.hpp"
#include "kiln/optim/adam8bit.hpp"
#include "kiln/optim/adamw.hpp"
#include "kiln/optim/lion.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/precision/bf16.hpp"
#include "kiln/precision/bf16_pure.hpp"
#include "kiln/precision/fp16.hpp"
#include "kiln/precision/fp32.hpp"
#include "kiln/precision/loss_scaler.hpp"
#include "kiln/profiler/memory.hpp"
#include "kiln/profiler/memory_meter.hpp"
#include "kiln/profiler/none.hpp"
#include "kiln/profiler/ops.hpp"
#include "kiln/profiler/phases.hpp"
#include "kiln/profiler/trace.hpp"
#include "kiln/sharding/single.hpp"
#ifdef USE_DISTRIBUTED  // LibTorch with c10d; the backends (Gloo, NCCL) are checked at run time
#include "kiln/sharding/ddp.hpp"
#include "kiln/sharding/local_sgd.hpp"
#endif

#include "kiln/accelerator.hpp"
#include "kiln/device.hpp"
#include "kiln/host_memory.hpp"
#include "kiln/threads.hpp"
#include "kiln/callbacks.hpp"
#include "kiln/schedule.hpp"
#include "kiln/trainer.hpp"

#include "kiln/data/fashion_mnist.hpp"
#include "kiln/data/loader.hpp"
#include "kiln/data/synthetic.hpp"
#include "kiln/data/text.hpp"
#include "kiln/data/views.hpp"
#include "kiln/io/state.hpp"
#include "kiln/models/cnn.hpp"
#include "kiln/models/cross_entropy.hpp"
#include "kiln/models/dropout.hpp"
#include "kiln/models/gelu.hpp"
#include "kiln/models/gpt.hpp"
#include "kiln/models/layer_norm.hpp"
#include "kiln/models/linear.hpp"
#include "kiln/models/mlp.hpp"
#include "kiln/recipe/recipe.hpp"
#include "kiln/recipe/run.hpp"
