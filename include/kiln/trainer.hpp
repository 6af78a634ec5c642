// kiln/trainer.hpp: kiln owns the loop (the shape of the HF Trainer and Lightning).
//
//   using trainer_t = kiln::trainer<kiln::optim::adamw>;   // other axes take their defaults
//   trainer_t trainer({.accelerator = {.optimizer = {.lr = 1e-3}}, .options = {.steps = 1000}});
//   auto summary = trainer.fit(model, train_loader, &test_data);   // or torch::nn::AnyModule(model)
//
// fit() drives an accelerator of the same policies: micro-steps, optimizer steps, the
// schedule, evaluation (a tensor pair, a dataset or a loader), the progress display,
// metrics.jsonl, periodic atomic saves and exact resume. Callbacks observe every step and
// evaluation and may stop the run.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/accelerator.hpp"
#include "kiln/callbacks.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/loader.hpp"
#include "kiln/data/tensor_pair.hpp"
#include "kiln/diagnostics.hpp"
#include "kiln/errors.hpp"
#include "kiln/io/state.hpp"
#include "kiln/loss.hpp"
#include "kiln/models/cross_entropy.hpp"
#include "kiln/progress.hpp"
#include "kiln/run_directory.hpp"
#include "kiln/threads.hpp"

namespace kiln {

struct trainer_options {
  std::int64_t steps = 0;          // optimizer steps to train to (required)
  std::int64_t log_every = 50;     // steps between metric lines
  std::int64_t eval_every = 0;     // steps between evaluations; 0 = once per epoch
  std::int64_t eval_batch_size = 1000;
  std::int64_t save_every = 0;     // steps between saved states; 0 = at the end only
  std::filesystem::path run_dir;   // empty = write nothing (no metrics, no state)
  bool resume = true;              // continue an unfinished run found in run_dir
  bool progress = true;            // show the progress display (rank 0 only)
  // Threads of LibTorch and OpenBLAS (kiln/threads.hpp): none = leave them as they are; 0 = the
  // cores nothing else runs on, re-checked every few steps; N = N.
  std::optional<int> threads;
  diagnostics_settings diagnostics;  // gradient health, non-finite detection, anomaly mode
  loss_function loss = losses::cross_entropy{};  // what is minimised and evaluated (kiln/loss.hpp)
  std::string recipe_text;         // written to run_dir/recipe.toml
  std::string fingerprint;         // what must match for a resume (model, data, policies)
};

namespace detail {

// A model is a ModuleHolder (model->forward) or a torch::nn::AnyModule (model.forward).
template <class Model>
torch::Tensor forward(Model& model, const torch::Tensor& inputs) {
  if constexpr (requires { model.forward(inputs); }) return model.forward(inputs);
  else return model->forward(inputs);
}

// Mean cross-entropy over the targets other than ignore_index (kiln::losses::cross_entropy).
inline torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return models::cross_entropy(logits, targets, ignore_index);
}

// How many of the accumulation policy's units the loss averaged over: a micro-batch is one,
// a sample one row of the targets, a token one of the loss's own items (a scored target).
inline double loss_items(loss_unit unit, const torch::Tensor& targets, const loss_function& loss = losses::cross_entropy{}) {
  switch (unit) {
    case loss_unit::sample: return static_cast<double>(targets.size(0));
    case loss_unit::token: return loss.items(targets);
    case loss_unit::micro_batch: break;
  }
  return 1.0;
}

// Samples [begin, end) of a dataset as one batch: views where the dataset slices (in memory),
// one gather where it gathers, else stacked from get().
template <data::dataset Dataset>
data::batch rows(const Dataset& data, std::int64_t begin, std::int64_t end) {
  if constexpr (requires { data.slice(begin, end); }) {
    return data.slice(begin, end);
  } else if constexpr (data::gathers_batches<Dataset>) {
    return data.gather(torch::arange(begin, end, torch::kLong));
  } else {
    collator out;
    for (std::int64_t i = begin; i < end; ++i) {
      const data::example e = data.get(i);
      if (i == begin) out = collator(end - begin, e);
      out.put(i - begin, i, e);
    }
    return out.take();
  }
}

// What a failed micro-step says: where it was, then the cause (first lines only: LibTorch's
// messages can go on for pages of dispatcher state).
inline std::string step_failure(std::int64_t step, std::int64_t micro, std::int64_t window, const char* doing,
                                const std::string& cause, const std::optional<failure_site>& site) {
  std::string where = "step " + std::to_string(step);
  if (window > 1) where += " (micro-batch " + std::to_string(micro + 1) + " of " + std::to_string(window) + ")";
  where += std::string(", ") + doing;
  if (site) where += ", " + site->text();
  std::string text = cause;
  std::size_t lines = 0, at = 0;
  while (at < text.size() && lines < 3) {
    at = text.find('\n', at);
    if (at == std::string::npos) break;
    ++lines, ++at;
  }
  if (lines == 3 && at < text.size()) text = text.substr(0, at) + "...";
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return where + ": " + text;
}

}  // namespace detail

template <class... Ps>
class trainer {
 public:
  using accelerator_t = accelerator<Ps...>;

  struct settings {
    typename accelerator_t::settings accelerator{};
    trainer_options options{};
  };

  explicit trainer(settings s = {}) : options_(std::move(s.options)) {
    s.accelerator.total_steps = options_.steps;
    acc_ = std::make_unique<accelerator_t>(std::move(s.accelerator));
  }

  void add_callback(std::shared_ptr<callback> c) { callbacks_.push_back(std::move(c)); }

  // The accelerator fit() drives; valid from construction, prepared by fit().
  accelerator_t& accel() { return *acc_; }

  // Trains `model` on batches from `train` until options.steps optimizer steps are done (or a
  // callback stops it), evaluating on `eval` when given: a tensor pair, a dataset or a loader
  // (see evaluate). `model` is a ModuleHolder or an AnyModule, also a temporary one.
  //
  // The loop: open the run directory (resuming where it left off), then per step train_step()
  // (data, forward, loss, backward, update), the callbacks (the progress display and
  // metrics.jsonl are the first two), evaluation when due, a save when due; at the end the
  // profiler's report, the final state and summary.json.
  template <class Model, data::batch_source Loader, class Eval = const data::tensor_pair>
  fit_summary fit(Model&& model, Loader& train, Eval* eval = nullptr) {
    if (options_.steps <= 0) throw config_error("trainer: options.steps must be > 0 (set [train] steps or epochs)");
    auto& module = *model.ptr();
    acc_->prepare(module);
    module.train();
    const bool main = acc_->is_main();
    const run_directory run(options_.run_dir, options_.recipe_text, options_.fingerprint);
    std::int64_t step = open_run(run, module, train);

    auto progress = std::make_shared<progress_callback>(options_.progress && main, main);
    std::vector<std::shared_ptr<callback>> observers{
        progress, std::make_shared<metrics_callback>(main ? run.metrics() : metrics_log())};
    observers.insert(observers.end(), callbacks_.begin(), callbacks_.end());
    const line_printer printer = progress->printer();
    for (auto& c : observers) c->on_fit_begin(step, options_.steps);

    // Diagnostics cost nothing unless enabled: no hooks, no checks, not even the object.
    diagnostics_.reset();
    if (options_.diagnostics.every > 0 || options_.diagnostics.anomaly) {
      diagnostics_.emplace(options_.diagnostics);
      diagnostics_->attach(module);
    }
    std::optional<thread_budget> threads;
    if (options_.threads) threads.emplace(*options_.threads);
    const auto eval_every = options_.eval_every > 0 ? options_.eval_every
                                                    : std::max<std::int64_t>(1, optimizer_steps_per_epoch(
                                                          acc_->accumulation(), train.batches_per_epoch()));
    const auto started = std::chrono::steady_clock::now();

    fit_summary summary;
    bool stop = false;
    auto notify = [&](auto hook) {
      for (auto& c : observers) stop = (hook(*c) == control::stop) || stop;
    };
    while (step < options_.steps && !stop) {
      step_info info = train_step(model, train);
      step = info.step;
      if (threads) threads->between_steps();
      info.total_steps = options_.steps;
      info.log_step = step % options_.log_every == 0 || step == options_.steps;
      info.steps_per_second = progress->steps_per_second(step);
      info.print = printer;
      summary.final_train_loss = info.loss;
      notify([&](callback& c) { return c.on_step_end(info); });
      if (diagnostics_ && diagnostics_->due(step)) {
        for (const auto& w : diagnostics_->warnings()) printer("kiln: warning: " + w);
        if (main) run.append_gradients(step, diagnostics_->last_report());
      }
      if (eval && (step % eval_every == 0 || step == options_.steps)) {
        summary.final_eval = evaluate(model, *eval);
        summary.final_eval.step = step;
        summary.evaluated = true;
        auto shown = summary.final_eval;  // a copy: the summary outlives the progress display
        shown.print = printer;
        notify([&](callback& c) { return c.on_eval(shown); });
      }
      if (!run.empty() && options_.save_every > 0 && step % options_.save_every == 0 && step < options_.steps)
        save(run, module, train);
    }

    summary.steps = step;
    summary.stopped_early = step < options_.steps;
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (threads) summary.threads = threads->threads(), summary.thread_changes = threads->changes();
    progress->on_fit_end(summary);  // the live line goes before the profiler's report prints
    auto& profiler = acc_->profiler();
    if constexpr (requires { profiler.finish(run.profile_dir()); }) {
      if (diagnostics_ && !diagnostics_->last_report().empty())
        profiler.set_gradient_health(diagnostics_->last_report(), diagnostics_->warnings());
      profiler.finish(run.profile_dir());
    }
    if (!run.empty()) {
      save(run, module, train);
      if (main && !summary.stopped_early) run.write_summary(summary_json(summary));
    }
    // The other callbacks last, so that the final state and summary.json are there to read.
    for (auto& c : observers)
      if (c != progress) c->on_fit_end(summary);
    return summary;
  }

  // The mean loss over `data` and the loss's metrics (accuracy, perplexity, ...), without
  // gradients, in eval mode. `data` is a tensor pair or a dataset (kiln/data/dataset.hpp), read
  // in batches of options.eval_batch_size; with several ranks each evaluates its own contiguous
  // share and the totals are summed over ranks. Or a loader: one epoch of its batches, from
  // where it stands (make it with shuffle = false, drop_last = false and, with several ranks,
  // pad_shards = false, so that each sample counts once).
  template <class Model>
  eval_info evaluate(Model& model, const data::tensor_pair& data) {
    return evaluate(model, data::in_memory(data));
  }
  template <class Model, data::dataset Dataset>
  eval_info evaluate(Model& model, const Dataset& data) {
    const auto all = static_cast<std::int64_t>(data.size()), world = acc_->world_size(), rank = acc_->rank();
    std::int64_t begin = all * rank / world;
    const std::int64_t end = all * (rank + 1) / world;
    return evaluate_batches(model, [&]() -> std::optional<data::batch> {
      if (begin >= end) return std::nullopt;
      const auto stop = std::min(begin + options_.eval_batch_size, end);
      auto batch = detail::rows(data, begin, stop);
      begin = stop;
      return batch;
    });
  }
  template <class Model, data::batch_source Loader>
  eval_info evaluate(Model& model, Loader& data) {
    std::int64_t left = data.batches_per_epoch();
    return evaluate_batches(model, [&]() -> std::optional<data::batch> {
      if (left-- <= 0) return std::nullopt;
      return data.next();
    });
  }

 private:
  // One optimizer step: an accumulation window of micro-batches from `train`, each placed on
  // the device, run forward through the model and the loss, and backward; then the update.
  // A failure names the step, the micro-batch, what it was doing and, for a forward, the module.
  template <class Model, data::batch_source Loader>
  step_info train_step(Model& model, Loader& train) {
    auto& acc = *acc_;
    const auto next_step = acc.optimizer_steps() + 1;
    const auto plan = acc.plan_window(train.batches_left_in_epoch());
    if (plan.skip_rest_of_epoch) train.skip_rest_of_epoch();
    const auto unit = acc.accumulation().unit();
    torch::Tensor loss_sum;  // micro-batch losses weighted by their items, summed on the device
    double items_sum = 0;
    for (std::int64_t micro = 0; micro < plan.micro_batches; ++micro) {
      static constexpr const char* forward_phase = "forward (model and loss)";
      const char* doing = "loading the batch";  // named by the step's error, if one is thrown
      torch::Tensor inputs, targets;
      auto forward_loss = [&] {
        auto cast = acc.autocast();
        return options_.loss(detail::forward(model, inputs), targets);
      };
      // Where in the model a forward failed, found by running it again under observation.
      auto failed_at = [&]() -> std::optional<failure_site> {
        if (doing != forward_phase) return std::nullopt;
        return diagnostics::locate_failure(*model.ptr(), [&] { (void)forward_loss(); });
      };
      try {
        {
          auto timed = acc.phase(phase::data);
          auto batch = train.next();
          // On the model's device (the data phase includes the copy to a GPU).
          inputs = acc.place(batch.inputs), targets = acc.place(batch.targets);
        }
        doing = forward_phase;
        torch::Tensor loss;
        {
          auto timed = acc.phase(phase::forward);
          auto watch = diagnostics_ ? diagnostics_->watch_forward(next_step) : diagnostics::forward_watch();
          loss = forward_loss();
        }
        doing = "backward";
        const double items = detail::loss_items(unit, targets, options_.loss);
        acc.backward(loss, items);
        // Read once per step: no extra op without accumulation.
        auto weighted = items == 1.0 ? loss.detach() : loss.detach() * items;
        loss_sum = loss_sum.defined() ? loss_sum + weighted : weighted;
        items_sum += items;
        if (diagnostics_ && acc.is_sync_step()) diagnostics_->after_backward(next_step);  // gradients complete
        doing = "the optimizer step";
        acc.step();
        if (diagnostics_ && acc.optimizer_steps() == next_step) diagnostics_->after_step(next_step);
      } catch (const c10::Error& e) {
        throw step_error(detail::step_failure(next_step, micro, plan.micro_batches, doing, e.what_without_backtrace(),
                                              failed_at()));
      } catch (const kiln::error&) {
        throw;  // already names its cause
      } catch (const std::exception& e) {
        throw step_error(detail::step_failure(next_step, micro, plan.micro_batches, doing, e.what(), failed_at()));
      }
    }
    const auto& result = acc.last_step();
    step_info info;
    info.step = acc.optimizer_steps();
    info.epoch = train.epoch();
    info.loss = loss_sum.item<double>() / items_sum;
    info.lr = result.lr;
    info.grad_norm = result.grad_norm;
    info.skipped = result.skipped;
    return info;
  }

  // Evaluation over the batches `next` hands out until it has none.
  template <class Model, class NextBatch>
  eval_info evaluate_batches(Model& model, NextBatch next) {
    auto& module = *model.ptr();
    const bool was_training = module.is_training();
    module.eval();
    torch::NoGradGuard no_grad;
    const auto& loss = options_.loss;
    const auto& metrics = loss.metrics();
    // Loss sum, items, then each metric's sum.
    torch::Tensor totals = torch::zeros({2 + static_cast<std::int64_t>(metrics.size())},
                                        torch::dtype(torch::kFloat64).device(acc_->device()));
    while (std::optional<data::batch> batch = next()) {
      auto inputs = acc_->place(batch->inputs);
      auto targets = acc_->place(batch->targets);
      torch::Tensor outputs;
      {
        auto cast = acc_->autocast();
        outputs = detail::forward(model, inputs);
      }
      outputs = outputs.to(torch::kFloat32);
      const double items = loss.items(targets);
      totals[0] += loss(outputs, targets).to(torch::kFloat64) * items;
      totals[1] += items;
      for (std::size_t i = 0; i < metrics.size(); ++i)
        if (metrics[i].sum) totals[2 + static_cast<std::int64_t>(i)] += metrics[i].sum(outputs, targets).to(torch::kFloat64);
    }
    totals = acc_->sum_over_ranks(totals).cpu();
    if (was_training) module.train();
    eval_info info;
    const double items = totals[1].item<double>();
    info.samples = static_cast<std::int64_t>(items);
    info.loss = totals[0].item<double>() / std::max(1.0, items);
    for (std::size_t i = 0; i < metrics.size(); ++i) {
      const double mean = totals[2 + static_cast<std::int64_t>(i)].item<double>() / std::max(1.0, items);
      info.metrics.push_back({metrics[i].name, metrics[i].value(mean, info.loss), metrics[i].percent});
      if (metrics[i].name == "accuracy") info.accuracy = info.metrics.back().value;
    }
    return info;
  }

  // Opens the run directory on rank 0 (resuming an unfinished run of the same recipe); the other
  // ranks follow its decision. Returns the step training continues from.
  template <class Loader>
  std::int64_t open_run(const run_directory& run, torch::nn::Module& module, Loader& train) {
    if (run.empty()) return 0;
    const bool main = acc_->is_main();
    std::int64_t step = 0;
    if (main && run.open(options_.resume)) step = resume(run, module, train);
    if (acc_->world_size() > 1) {
      // Rank 0 decided whether to resume (and moved an old run away); the others follow it, after
      // it is done with the directory: the sum is over ranks, so it waits for rank 0.
      const auto agreed =
          acc_->sum_over_ranks(torch::full({1}, main ? static_cast<double>(step) : 0.0, torch::kFloat64));
      if (!main && agreed.template item<double>() > 0) step = resume(run, module, train);
    }
    return step;
  }

  // Continues the run saved in `run`: model, accelerator (optimizer, scaler, step), data
  // position and RNG, as they were at the save. Returns the step it continues from.
  template <class Loader>
  std::int64_t resume(const run_directory& run, torch::nn::Module& module, Loader& train) {
    if (!run.has_state()) return 0;
    auto state = run.load_state();
    load_module(module, state, "model/");
    acc_->load_state(state);
    train.load_state(state, "data/");
    at::Generator cpu_generator = at::globalContext().defaultGenerator(torch::kCPU);
    cpu_generator.set_state(require(state, "rng/cpu"));
    // Dropout on a GPU draws from that device's generator. A state saved on another device kind
    // (a CPU run resumed on a GPU) leaves it as seeded.
    if (const auto cuda = state.find("rng/cuda"); cuda != state.end() && acc_->device().is_cuda()) {
      at::Generator cuda_generator = at::globalContext().defaultGenerator(acc_->device());
      cuda_generator.set_state(cuda->second);
    }
    const auto step = acc_->optimizer_steps();
    if (acc_->is_main()) run.resume_metrics_at(step);
    std::fprintf(stderr, "kiln: resuming %s at step %lld\n", run.path().c_str(), (long long)step);
    return step;
  }

  // Rank 0 writes the state; every rank collects it where that is a collective (a sharded
  // optimizer state is gathered from all of them).
  template <class Loader>
  void save(const run_directory& run, const torch::nn::Module& module, const Loader& train) {
    if (!acc_->is_main() && !accelerator_t::saves_collectively) return;
    auto state = collect_state(module, train);
    if (acc_->is_main()) run.save_state(state);
  }

  // Everything resume() restores.
  template <class Loader>
  state_dict collect_state(const torch::nn::Module& module, const Loader& train) const {
    state_dict state;
    save_module(module, state, "model/");
    acc_->save_state(state);
    train.save_state(state, "data/");
    state["rng/cpu"] = at::globalContext().defaultGenerator(torch::kCPU).get_state();
    if (acc_->device().is_cuda()) state["rng/cuda"] = at::globalContext().defaultGenerator(acc_->device()).get_state();
    return state;
  }

  // summary.json: the run's final figures and what the sharding policy's collectives cost.
  json_line summary_json(const fit_summary& s) const {
    json_line line;
    line.add("steps", s.steps).add("seconds", s.seconds).add("final_train_loss", s.final_train_loss);
    if (s.threads > 0) line.add("threads", static_cast<std::int64_t>(s.threads)).add("thread_changes", s.thread_changes);
    if (s.evaluated) {
      line.add("eval_loss", s.final_eval.loss);
      for (const auto& m : s.final_eval.metrics) line.add("eval_" + m.name, m.value);
    }
    // Rank 0's optimizer state: 1/N of the whole where the sharding policy splits it (zero1).
    line.add("optimizer_state_bytes", acc_->optimizer().state_bytes());
    // What the sharding policy's collectives cost (rank 0's count; every rank issues the same).
    auto& sharding = acc_->sharding();
    line.add("world_size", acc_->world_size());
    if constexpr (requires { sharding.buckets(); }) line.add("buckets", sharding.buckets());
    if constexpr (requires { sharding.gradient_allreduces(); })
      line.add("gradient_allreduces", sharding.gradient_allreduces());
    if constexpr (requires { sharding.parameter_averages(); })
      line.add("parameter_averages", sharding.parameter_averages());
    if constexpr (requires { sharding.collective_bytes(); }) line.add("collective_bytes", sharding.collective_bytes());
    if constexpr (requires { sharding.allreduce_wait_s(); }) line.add("allreduce_wait_s", sharding.allreduce_wait_s());
    return line;
  }

  trainer_options options_;
  std::unique_ptr<accelerator_t> acc_;
  std::optional<diagnostics> diagnostics_;  // during fit(), when options.diagnostics asks for them
  std::vector<std::shared_ptr<callback>> callbacks_;
};

}  // namespace kiln
