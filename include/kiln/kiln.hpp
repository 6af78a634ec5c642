// kiln/kiln.hpp: the public include of kiln, the library.
//
// kiln turns a LibTorch model into a training run from policies that compose at compile time:
//   kiln::trainer<kiln::optim::adamw>           kiln owns the loop (fit, evaluate, resume)
//   kiln::accelerator<kiln::optim::adamw>       you own the loop (prepare, backward, step)
// This header is the loop and its policies only. Three more sit beside it, each including it:
//   kiln/models.hpp     kiln's models (mlp, cnn, gpt) and the layers they are built from
//   kiln/datasets.hpp   kiln's datasets (Fashion-MNIST, text, synthetic)
//   kiln/recipes.hpp    TOML recipes: reading, checking and running them, and the registry of
//                       every kind a recipe may name (which brings toml++ and the two above)
// They are apart because a file that includes a kind instantiates it: a file with one trainer
// type compiles in a fraction of the time without them (docs/benchmarks.md, "Compile time of a user's file").
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
#include "kiln/sharding/zero1.hpp"
#endif

#include "kiln/accelerator.hpp"
#include "kiln/device.hpp"
#include "kiln/host_memory.hpp"
#include "kiln/threads.hpp"
#include "kiln/callbacks.hpp"
#include "kiln/schedule.hpp"
#include "kiln/loss.hpp"
#include "kiln/trainer.hpp"

#include "kiln/data/loader.hpp"
#include "kiln/data/views.hpp"
#include "kiln/io/state.hpp"
