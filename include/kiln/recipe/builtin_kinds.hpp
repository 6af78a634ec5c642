// kiln/recipe/builtin_kinds.hpp: kiln's own kinds, registered as a user registers theirs
// (kiln/recipe/registry.hpp). Their order here is the order in which messages and `kiln list`
// show them, and a combined profiler kind names its collectors ("ops+trace+memory+phases").
#pragma once

#include "kiln/accumulation/steps.hpp"
#include "kiln/checkpointing/blocks.hpp"
#include "kiln/checkpointing/every_nth.hpp"
#include "kiln/checkpointing/none.hpp"
#include "kiln/checkpointing/selective.hpp"
#include "kiln/data/fashion_mnist.hpp"
#include "kiln/data/synthetic.hpp"
#include "kiln/data/text.hpp"
#include "kiln/loss.hpp"
#include "kiln/models/cnn.hpp"
#include "kiln/models/gpt.hpp"
#include "kiln/models/mlp.hpp"
#include "kiln/optim/adafactor.hpp"
#include "kiln/optim/adam8bit.hpp"
#include "kiln/optim/adamw.hpp"
#include "kiln/optim/lion.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/precision/bf16.hpp"
#include "kiln/precision/bf16_pure.hpp"
#include "kiln/precision/fp16.hpp"
#include "kiln/precision/fp32.hpp"
#include "kiln/profiler/memory.hpp"
#include "kiln/profiler/none.hpp"
#include "kiln/profiler/ops.hpp"
#include "kiln/profiler/phases.hpp"
#include "kiln/profiler/trace.hpp"
#include "kiln/recipe/registry.hpp"
#include "kiln/sharding/single.hpp"
#ifdef USE_DISTRIBUTED
#include "kiln/sharding/ddp.hpp"
#include "kiln/sharding/local_sgd.hpp"
#include "kiln/sharding/zero1.hpp"
#endif

// The same registration as KILN_REGISTER_*, ranked by line so that kiln's kinds come first.
#define KILN_DETAIL_BUILTIN(register_function, ...) \
  KILN_DETAIL_REGISTER(::kiln::register_function<__VA_ARGS__>(#__VA_ARGS__, __LINE__))

KILN_DETAIL_BUILTIN(register_policy, kiln::precision::fp32)
KILN_DETAIL_BUILTIN(register_policy, kiln::precision::bf16)
KILN_DETAIL_BUILTIN(register_policy, kiln::precision::fp16)
KILN_DETAIL_BUILTIN(register_policy, kiln::precision::bf16_pure)
KILN_DETAIL_BUILTIN(register_policy, kiln::accumulation::steps)
KILN_DETAIL_BUILTIN(register_policy, kiln::checkpointing::none)
KILN_DETAIL_BUILTIN(register_policy, kiln::checkpointing::blocks)
KILN_DETAIL_BUILTIN(register_policy, kiln::checkpointing::every_nth)
KILN_DETAIL_BUILTIN(register_policy, kiln::checkpointing::selective)
KILN_DETAIL_BUILTIN(register_policy, kiln::sharding::single)
#ifdef USE_DISTRIBUTED
KILN_DETAIL_BUILTIN(register_policy, kiln::sharding::ddp)
KILN_DETAIL_BUILTIN(register_policy, kiln::sharding::local_sgd)
KILN_DETAIL_BUILTIN(register_policy, kiln::sharding::zero1)
#endif
KILN_DETAIL_BUILTIN(register_policy, kiln::optim::sgd)
KILN_DETAIL_BUILTIN(register_policy, kiln::optim::adamw)
KILN_DETAIL_BUILTIN(register_policy, kiln::optim::adafactor)
KILN_DETAIL_BUILTIN(register_policy, kiln::optim::adam8bit)
KILN_DETAIL_BUILTIN(register_policy, kiln::optim::lion)
KILN_DETAIL_BUILTIN(register_policy, kiln::profiler::none)
// Profiler kinds combine: kind = ["ops", "memory"] is kiln::profiler::profile<ops_collector,
// memory_collector>, named "ops+memory" (in this order).
KILN_DETAIL_BUILTIN(register_profiler_collector, kiln::profiler::ops_collector)
KILN_DETAIL_BUILTIN(register_profiler_collector, kiln::profiler::trace_collector)
KILN_DETAIL_BUILTIN(register_profiler_collector, kiln::profiler::memory_collector)
KILN_DETAIL_BUILTIN(register_profiler_collector, kiln::profiler::phases_collector)

KILN_DETAIL_BUILTIN(register_model, kiln::models::mlp_settings)
KILN_DETAIL_BUILTIN(register_model, kiln::models::cnn_settings)
KILN_DETAIL_BUILTIN(register_model, kiln::models::gpt_settings)

KILN_DETAIL_BUILTIN(register_dataset, kiln::data::fashion_mnist_settings)
KILN_DETAIL_BUILTIN(register_dataset, kiln::data::text_settings)
KILN_DETAIL_BUILTIN(register_dataset, kiln::data::synthetic_classification_settings)
KILN_DETAIL_BUILTIN(register_dataset, kiln::data::synthetic_tokens_settings)
KILN_DETAIL_BUILTIN(register_dataset, kiln::data::synthetic_regression_settings)

KILN_DETAIL_BUILTIN(register_loss, kiln::losses::cross_entropy)
KILN_DETAIL_BUILTIN(register_loss, kiln::losses::next_token)
KILN_DETAIL_BUILTIN(register_loss, kiln::losses::mse)
KILN_DETAIL_BUILTIN(register_loss, kiln::losses::l1)

KILN_DETAIL_BUILTIN(register_schedule, kiln::schedules::constant)
KILN_DETAIL_BUILTIN(register_schedule, kiln::schedules::linear)
KILN_DETAIL_BUILTIN(register_schedule, kiln::schedules::cosine)
