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
#include "kiln/data/loader.hpp"
#include "kiln/errors.hpp"
#include "kiln/recipe/recipe.hpp"
#include "kiln/trainer.hpp"

namespace kiln {

struct run_request {
  bool progress = true;
};

namespace detail {

// The [data] kind's sets, and what the model learns of them.
struct dataset_pair {
  data::tensor_pair train, eval;
  data_info info;
};

// The registry's entry for the kind a table of the recipe names. Reading the recipe refused kinds
// no registry has; a miss here is a program built without the registration of one that was.
template <class Entry>
const Entry& registered_entry(const std::vector<Entry>& entries, const recipe& r, std::string_view table,
                              const std::string& kind) {
  const auto* entry = find_kind(entries, kind);
  if (!entry)
    throw config_error(r.file.string() + ": [" + std::string(table) + "] kind = \"" + kind + "\" is not registered");
  return *entry;
}

// A dataset error names the file it could not read; this adds which line of the recipe (or which
// --set) pointed there, so that a typo in data.path is found where it was made.
inline dataset_pair load_data(const recipe& r) {
  const auto& entry = registered_entry(registered_datasets(), r, "data", r.data.kind);
  const toml::node* path = r.document.at_path("data.path").node();
  const std::string where = path ? r.sources.where("data.path", path->source()) : r.file.string();
  std::string what = "[data] kind = \"" + r.data.kind + "\"";
  if (const auto value = path ? path->value<std::string>() : std::nullopt) what += ", path = \"" + *value + "\"";
  try {
    data::loaded loaded = entry.make(r.data.own, data_request{static_cast<std::uint64_t>(r.train.seed)});
    auto info = data_info::of(r.data.kind, loaded);
    return {std::move(loaded.train), std::move(loaded.eval), std::move(info)};
  } catch (const data_error& e) {
    throw data_error(where + ": " + what + ": " + e.what());
  } catch (const config_error& e) {
    throw config_error(where + ": " + what + ": " + e.what());
  }
}

// The loss the recipe names, or for kind = "auto" the one the data's targets call for.
inline loss_function make_loss(const recipe& r, const dataset_pair& data) {
  const auto kind = r.loss.resolved_kind(data.info.targets);
  const auto& entry = registered_entry(registered_losses(), r, "loss", kind);
  if (r.loss.kind == loss_settings::automatic) return entry.make(entry.make_settings());
  return entry.make(r.loss.own);
}

// Builds the model the recipe names; the model kind checks that it fits the data.
inline torch::nn::AnyModule make_model(const recipe& r, const dataset_pair& data) {
  const auto& entry = registered_entry(registered_models(), r, "model", r.model.kind);
  try {
    return entry.make(r.model.own, data.info);
  } catch (const config_error& e) {
    throw config_error(r.file.string() + ": [model] kind = \"" + r.model.kind + "\" on [data] kind = \"" + r.data.kind +
                       "\": " + e.what());
  }
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
#define KILN_DETAIL_READ_AXIS(axis_name, default_policy) r.read_axis(axis::axis_name::name, s.axis_name);
  KILN_AXES(KILN_DETAIL_READ_AXIS)
#undef KILN_DETAIL_READ_AXIS
  // A recipe's profilers may be a subset of those compiled in (kiln::cli::find_combination).
  if constexpr (requires { s.profiler.only; })
    if (r.kinds[profiler_axis] != acc_t::profiler_t::kind) s.profiler.only = r.kinds[profiler_axis];
  s.scheduler = detail::registered_entry(registered_schedules(), r, "scheduler", r.scheduler.kind).make(r.scheduler.own);
  s.clip_grad_norm = r.train.clip_grad_norm;
  return s;
}

namespace detail {
// The kind an axis is resolved to: the policy compiled in, but for the profiler the recipe's
// subset of those compiled in.
template <class Axis, class Policy>
std::string_view resolved_kind(const recipe& r) {
  if constexpr (std::is_same_v<Axis, axis::profiler>) return r.kinds[profiler_axis];
  else return Policy::kind;
}
}  // namespace detail

// The recipe with every value resolved (defaults included), and the part of it that must
// match for a run directory to be resumed.
template <class Trainer>
std::pair<std::string, std::string> resolve_recipe(const recipe& r) {
  using acc_t = typename Trainer::accelerator_t;
  auto s = read_policy_settings<Trainer>(r);
  std::ostringstream axes;
#define KILN_DETAIL_WRITE_AXIS(axis_name, default_policy)                                                   \
  detail::write_axis(axes, axis::axis_name::name, detail::resolved_kind<axis::axis_name, typename acc_t::axis_name##_t>(r), \
                     s.axis_name);
  KILN_AXES(KILN_DETAIL_WRITE_AXIS)
#undef KILN_DETAIL_WRITE_AXIS
  auto text = r.resolved([&](std::ostream& out) { out << axes.str(); });

  std::ostringstream fingerprint;
  detail::toml_writer writer(fingerprint);
  auto model = r.model;
  auto data = r.data;
  fingerprint << "[model]\n";
  model.describe(writer);
  fingerprint << "[data]\n";
  data.describe(writer);
  auto loss = r.loss;
  fingerprint << "[loss]\n";
  loss.describe(writer);
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
  const auto steps_per_epoch = optimizer_steps_per_epoch(accumulation, loader.batches_per_epoch());
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
  o.resume = r.run.resume == resume_policy::automatic;
  o.progress = request.progress;
  o.diagnostics = r.diagnostics;
  o.threads = static_cast<int>(r.train.threads);
  o.loss = detail::make_loss(r, data);
  std::tie(o.recipe_text, o.fingerprint) = resolve_recipe<Trainer>(r);

  std::int64_t parameters = 0;
  for (const auto& p : model.ptr()->parameters()) parameters += p.numel();
  std::fprintf(stderr,
               "kiln: %s | %s | loss %s | %lld parameters | %lld train / %lld eval samples | %lld steps | %s | %s\n",
               r.info.name.c_str(), r.combination().c_str(), std::string(o.loss.kind()).c_str(), (long long)parameters,
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
    if (data.info.tokens() || data.info.sample_shape.size() != 3)
      throw config_error(r.file.string() + ": data.crop_padding and data.flip augment images ([channels, height, width]) but [data] kind = \"" +
                         r.data.kind + "\" gives samples shaped " + data.info.shape_text());
    data::loader loader(data::in_memory(data.train), loader_options,
                        data::compose(data::random_crop{r.data.crop_padding}, data::horizontal_flip{r.data.flip}));
    return detail::fit_recipe<Trainer>(r, request, std::move(settings), model, loader, data);
  }
  data::batch_loader loader(data.train, loader_options);
  return detail::fit_recipe<Trainer>(r, request, std::move(settings), model, loader, data);
}

}  // namespace kiln
