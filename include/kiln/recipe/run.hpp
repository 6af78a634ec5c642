// kiln/recipe/run.hpp: turns a recipe into a trainer run, for one compiled combination.
//
// run_recipe<trainer<Ps...>> reads the axis tables into the policies' settings (strictly),
// builds the data and the model, derives the step count and runs fit(). The CLI holds one
// instantiation per combination the build compiled (see kiln/cli.hpp and cmake/kiln.cmake).
#pragma once

#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include <torch/torch.h>

#ifdef USE_DISTRIBUTED
#include "kiln/detail/process_group.hpp"
#endif
#include "kiln/data/fashion_mnist.hpp"
#include "kiln/data/loader.hpp"
#include "kiln/data/synthetic.hpp"
#include "kiln/data/text.hpp"
#include "kiln/errors.hpp"
#include "kiln/models/cnn.hpp"
#include "kiln/models/gpt.hpp"
#include "kiln/models/mlp.hpp"
#include "kiln/recipe/recipe.hpp"
#include "kiln/trainer.hpp"

namespace kiln {

struct run_request {
  bool progress = true;
};

namespace detail {

struct dataset_pair {
  data::tensor_pair train, eval;
  std::int64_t features = 0;  // per sample, flattened (classification)
  std::int64_t classes = 0;   // classes, or vocabulary size for token data
  std::int64_t seq_len = 0;   // token data only
};

inline dataset_pair load_data_by_kind(const recipe& r) {
  const auto& d = r.data;
  const auto seed = static_cast<std::uint64_t>(r.train.seed);
  if (d.kind == "fashion-mnist") {
    return {data::load_fashion_mnist(d.path, data::split::train), data::load_fashion_mnist(d.path, data::split::test),
            28 * 28, 10, 0};
  }
  if (d.kind == "synthetic-classification") {
    // Train and evaluation samples come from one draw, so they share the teacher.
    auto all = data::make_classification(d.samples + d.eval_samples, d.features, d.classes, seed);
    return {{all.inputs.slice(0, 0, d.samples), all.targets.slice(0, 0, d.samples)},
            {all.inputs.slice(0, d.samples), all.targets.slice(0, d.samples)},
            d.features, d.classes, 0};
  }
  if (d.kind == "text") {
    auto corpus = data::load_text({.path = d.path, .seq_len = d.seq_len, .eval_fraction = d.eval_fraction});
    std::fprintf(stderr, "kiln: text corpus %s: %zu files, %lld bytes\n", d.path.c_str(), corpus.files.size(),
                 (long long)corpus.bytes);
    return {std::move(corpus.train), std::move(corpus.eval), 0, data::byte_vocabulary, d.seq_len};
  }
  if (d.min_len > d.seq_len)
    throw config_error(r.file.string() + ": data.min_len = " + std::to_string(d.min_len) + " is longer than data.seq_len = " +
                       std::to_string(d.seq_len));
  auto all = data::make_token_sequences(d.samples + d.eval_samples, d.seq_len, d.vocab_size, seed, d.min_len);
  return {{all.inputs.slice(0, 0, d.samples), all.targets.slice(0, 0, d.samples)},
          {all.inputs.slice(0, d.samples), all.targets.slice(0, d.samples)},
          0, d.vocab_size, d.seq_len};
}

// A dataset error names the file it could not read; this adds which line of the recipe (or which
// --set) pointed there, so that a typo in data.path is found where it was made.
inline dataset_pair load_data(const recipe& r) {
  try {
    return load_data_by_kind(r);
  } catch (const data_error& e) {
    const toml::node* path = r.document.at_path("data.path").node();
    const std::string where = path ? r.sources.where("data.path", path->source()) : r.file.string();
    throw data_error(where + ": [data] kind = \"" + r.data.kind + "\", path = \"" + r.data.path + "\": " + e.what());
  }
}

[[noreturn]] inline void mismatch(const recipe& r, const std::string& key, std::int64_t model_value,
                                  const std::string& data_text, std::int64_t data_value) {
  throw config_error(r.file.string() + ": model." + key + " = " + std::to_string(model_value) + " but [data] kind = \"" +
                     r.data.kind + "\" gives " + data_text + " " + std::to_string(data_value) + "; set model." + key +
                     " = " + std::to_string(data_value));
}

// Builds the model the recipe names, checking that it fits the data.
inline torch::nn::AnyModule make_model(const recipe& r, const dataset_pair& data) {
  const auto& m = r.model;
  const bool tokens = r.data.kind == "synthetic-tokens" || r.data.kind == "text";
  if (tokens != (m.kind == "gpt"))
    throw config_error(r.file.string() + ": model.kind = \"" + m.kind + "\" cannot train on [data] kind = \"" +
                       r.data.kind + "\" (token data needs gpt; gpt needs token data)");
  if (m.kind == "mlp") {
    if (m.mlp.in_features != data.features) mismatch(r, "in_features", m.mlp.in_features, "features", data.features);
    if (m.mlp.classes != data.classes) mismatch(r, "classes", m.mlp.classes, "classes", data.classes);
    return torch::nn::AnyModule(models::mlp(m.mlp));
  }
  if (m.kind == "cnn") {
    if (r.data.kind != "fashion-mnist")
      throw config_error(r.file.string() + ": model.kind = \"cnn\" needs image data ([data] kind = \"fashion-mnist\")");
    if (m.cnn.classes != data.classes) mismatch(r, "classes", m.cnn.classes, "classes", data.classes);
    return torch::nn::AnyModule(models::cnn(m.cnn));
  }
  if (m.gpt.vocab_size < data.classes) mismatch(r, "vocab_size", m.gpt.vocab_size, "vocab_size", data.classes);
  if (m.gpt.seq_len < data.seq_len) mismatch(r, "seq_len", m.gpt.seq_len, "seq_len", data.seq_len);
  return torch::nn::AnyModule(models::gpt(m.gpt));
}

template <class Settings>
void write_axis(std::ostream& out, std::string_view axis, std::string_view kind, Settings settings) {
  out << "\n[" << axis << "]\nkind = ";
  if (kind.find('+') == std::string_view::npos) {
    out << '"' << kind << "\"\n";
  } else {  // combined profilers, "ops+memory", read back as the list they came from
    out << "[";
    for (std::size_t at = 0; at != std::string_view::npos;) {
      const auto plus = kind.find('+', at);
      out << (at ? ", \"" : "\"") << kind.substr(at, plus == std::string_view::npos ? plus : plus - at) << '"';
      at = plus == std::string_view::npos ? plus : plus + 1;
    }
    out << "]\n";
  }
  toml_writer writer(out);
  settings.describe(writer);
}

}  // namespace detail

// Reads the axis tables of `r` into the accelerator settings of Trainer, strictly.
template <class Trainer>
typename Trainer::accelerator_t::settings read_policy_settings(const recipe& r) {
  using acc_t = typename Trainer::accelerator_t;
  typename acc_t::settings s;
  r.read_axis(axis::precision::name, s.precision);
  r.read_axis(axis::accumulation::name, s.accumulation);
  r.read_axis(axis::checkpointing::name, s.checkpointing);
  r.read_axis(axis::sharding::name, s.sharding);
  r.read_axis(axis::optimizer::name, s.optimizer);
  r.read_axis(axis::profiler::name, s.profiler);
  // A recipe's profilers may be a subset of those compiled in (kiln::cli::find_combination).
  if constexpr (requires { s.profiler.only; })
    if (r.kinds[profiler_axis] != acc_t::profiler_t::kind) s.profiler.only = r.kinds[profiler_axis];
  s.scheduler = r.scheduler;
  s.clip_grad_norm = r.train.clip_grad_norm;
  return s;
}

// The recipe with every value resolved (defaults included), and the part of it that must
// match for a run directory to be resumed.
template <class Trainer>
std::pair<std::string, std::string> resolve_recipe(const recipe& r) {
  using acc_t = typename Trainer::accelerator_t;
  auto s = read_policy_settings<Trainer>(r);
  std::ostringstream axes;
  detail::write_axis(axes, axis::precision::name, acc_t::precision_t::kind, s.precision);
  detail::write_axis(axes, axis::accumulation::name, acc_t::accumulation_t::kind, s.accumulation);
  detail::write_axis(axes, axis::checkpointing::name, acc_t::checkpointing_t::kind, s.checkpointing);
  detail::write_axis(axes, axis::sharding::name, acc_t::sharding_t::kind, s.sharding);
  detail::write_axis(axes, axis::optimizer::name, acc_t::optimizer_t::kind, s.optimizer);
  detail::write_axis(axes, axis::profiler::name, r.kinds[profiler_axis], s.profiler);
  auto text = r.resolved([&](std::ostream& out) { out << axes.str(); });

  std::ostringstream fingerprint;
  detail::toml_writer writer(fingerprint);
  auto model = r.model;
  auto data = r.data;
  fingerprint << "[model]\n";
  model.describe(writer);
  fingerprint << "[data]\n";
  data.describe(writer);
  fingerprint << axes.str();
  return {text, fingerprint.str()};
}

inline std::int64_t resolve_threads(std::int64_t requested) {
  if (requested > 0) return requested;
  return std::max<std::int64_t>(1, std::thread::hardware_concurrency());
}

namespace detail {

struct place_in_job {
  std::int64_t rank = 0, world = 1;
};

// This process's rank and the job's size, for a sharding policy whose ranks come from the launch
// environment (torchrun's variables): the loader gives each rank its shard of every epoch.
template <class Sharding>
place_in_job process_place() {
  if constexpr (requires { Sharding::distributed; }) {
#ifdef USE_DISTRIBUTED
    if (const auto env = read_dist_env()) return {env->rank, env->world};
#endif
  }
  return {};
}

// The part of run_recipe that depends on the loader's type (augmented or not).
template <class Trainer, class Loader>
fit_summary fit_recipe(const recipe& r, const run_request& request, typename Trainer::settings settings,
                       torch::nn::AnyModule& model, Loader& loader, const dataset_pair& data) {
  const typename Trainer::accelerator_t::accumulation_t accumulation(settings.accelerator.accumulation);
  const auto steps_per_epoch = detail::optimizer_steps_per_epoch(accumulation, loader.batches_per_epoch());
  if (steps_per_epoch == 0)
    throw config_error(r.file.string() + ": one optimizer step needs " + std::to_string(accumulation.micro_steps()) +
                       " x " + std::to_string(r.data.batch_size) + " samples, more than the " +
                       std::to_string(loader.samples()) + " in the training set");

  auto& o = settings.options;
  o.steps = r.train.steps > 0 ? r.train.steps : r.train.epochs * steps_per_epoch;
  o.log_every = r.train.log_every;
  o.eval_every = r.train.eval_every;
  o.eval_batch_size = r.data.eval_batch_size;
  o.save_every = r.run.save_every;
  o.run_dir = r.run_dir();
  o.resume = r.run.resume == "auto";
  o.progress = request.progress;
  o.diagnostics = r.diagnostics;
  o.threads = static_cast<int>(r.train.threads);
  std::tie(o.recipe_text, o.fingerprint) = resolve_recipe<Trainer>(r);

  std::int64_t parameters = 0;
  for (const auto& p : model.ptr()->parameters()) parameters += p.numel();
  std::fprintf(stderr,
               "kiln: %s | %s | %lld parameters | %lld train / %lld eval samples | %lld steps | %s | %s\n",
               r.info.name.c_str(), r.combination().c_str(), (long long)parameters,
               (long long)data.train.inputs.size(0), (long long)data.eval.inputs.size(0), (long long)o.steps,
               (r.train.threads > 0 ? std::to_string(r.train.threads) + " threads"
                                    : "threads: the free ones of " + std::to_string(resolve_threads(0)) + " cores")
                   .c_str(),
               settings.accelerator.device.c_str());

  Trainer trainer(std::move(settings));
  return trainer.fit(model, loader, &data.eval);
}

}  // namespace detail

template <class Trainer>
fit_summary run_recipe(const recipe& r, const run_request& request = {}) {
  auto settings = typename Trainer::settings{};
  settings.accelerator = read_policy_settings<Trainer>(r);  // a recipe's mistakes show before the data loads

  // Loading uses every core; from the first step the trainer keeps LibTorch's and OpenBLAS's
  // threads to [train] threads, or with 0 to the cores nothing else runs on (kiln/threads.hpp).
  at::set_num_threads(static_cast<int>(resolve_threads(r.train.threads)));
  torch::manual_seed(static_cast<std::uint64_t>(r.train.seed));
  const auto device = resolve_device(r.train.device, r.file.string() + ": [train] device");
  settings.accelerator.device = device.str();

  auto data = detail::load_data(r);
  auto model = detail::make_model(r, data);
  const auto place = detail::process_place<typename Trainer::accelerator_t::sharding_t>();

  const data::loader_options loader_options{.batch_size = r.data.batch_size,
                                            .shuffle = r.data.shuffle,
                                            .drop_last = true,
                                            .seed = static_cast<std::uint64_t>(r.train.seed),
                                            .delay_ms = r.data.delay_ms,
                                            .workers = r.data.workers,
                                            .prefetch = r.data.prefetch,
                                            .rank = place.rank,
                                            .world = place.world,
                                            .pin_memory = device.is_cuda()};
  if (r.data.crop_padding > 0 || r.data.flip > 0) {
    data::loader loader(data::in_memory(data.train), loader_options,
                        data::compose(data::random_crop{r.data.crop_padding}, data::horizontal_flip{r.data.flip}));
    return detail::fit_recipe<Trainer>(r, request, std::move(settings), model, loader, data);
  }
  data::batch_loader loader(data.train, loader_options);
  return detail::fit_recipe<Trainer>(r, request, std::move(settings), model, loader, data);
}

}  // namespace kiln
