// ddp and local-sgd with real processes over loopback, started by `kiln launch`: checked against
// one process training on the global batch (the reference DDP must equal), by the collectives
// they count, and by what happens when a rank dies.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include <signal.h>
#include <sys/wait.h>

#include "../cli_process.hpp"
#include "../temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

using kiln::test::kiln_cli;

// A small classification job; `sharding` and `optimizer` pick a combination the CLI has compiled
// (from recipes/ddp.toml, local-sgd.toml, quickstart.toml and cnn.toml).
std::string job(const std::string& sharding, const std::string& optimizer, std::int64_t batch, std::int64_t steps,
                std::int64_t accumulation = 1) {
  std::ostringstream r;
  r << "[recipe]\nname = \"dist\"\n"
    << "[model]\nkind = \"mlp\"\nin_features = 16\nhidden = [32, 32]\nclasses = 4\ndropout = 0.0\n"
    << "[data]\nkind = \"synthetic-classification\"\nfeatures = 16\nclasses = 4\nsamples = 2048\neval_samples = 256\n"
    << "batch_size = " << batch << "\n"
    << "[train]\nsteps = " << steps << "\nthreads = 1\nlog_every = 1\n"
    << "[accumulation]\nsteps = " << accumulation << "\n"
    << "[sharding]\n" << sharding << "\n"
    << "[optimizer]\n" << optimizer << "\n";
  return r.str();
}

const std::string adamw = "kind = \"adamw\"\nlr = 0.01";
const std::string sgd = "kind = \"sgd\"\nlr = 0.1\nmomentum = 0.9";

// The largest difference between the entries of two runs' saved states whose names start with
// `prefix` (both must hold them, shaped alike), and how many there are.
std::pair<double, int> max_state_difference(const fs::path& run_a, const fs::path& run_b, const std::string& prefix) {
  const auto a = kiln::load_state_file(run_a / "state.pt");
  const auto b = kiln::load_state_file(run_b / "state.pt");
  double worst = 0;
  int compared = 0;
  for (const auto& [name, value] : a) {
    if (name.rfind(prefix, 0) != 0) continue;
    REQUIRE_MESSAGE(b.count(name) == 1, name);
    REQUIRE_MESSAGE(value.sizes() == b.at(name).sizes(), name);
    worst = std::max(worst, (value - b.at(name)).abs().max().item<double>());
    ++compared;
  }
  return {worst, compared};
}

double max_parameter_difference(const fs::path& run_a, const fs::path& run_b, int tensors = 6) {
  const auto [worst, compared] = max_state_difference(run_a, run_b, "model/");
  REQUIRE(compared == tensors);  // the MLP's: three Linear layers
  return worst;
}

// Between two runs' saved optimizer states (moments, step counts).
double max_optimizer_state_difference(const fs::path& run_a, const fs::path& run_b) {
  const auto [worst, compared] = max_state_difference(run_a, run_b, "optim/");
  REQUIRE(compared > 0);
  return worst;
}

// Bytes of the model's parameters in a run's state: what one full all-reduce sends.
double parameter_bytes(const fs::path& run) {
  double bytes = 0;
  for (const auto& [name, value] : kiln::load_state_file(run / "state.pt"))
    if (name.rfind("model/", 0) == 0) bytes += static_cast<double>(value.numel() * value.element_size());
  return bytes;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

double summary_field(const fs::path& run, const std::string& key) {
  const auto text = read_file(run / "summary.json");
  const auto at = text.find("\"" + key + "\": ");
  REQUIRE_MESSAGE(at != std::string::npos, key, " missing from ", text);
  return std::stod(text.substr(at + key.size() + 4));
}

std::string run_dir_option(const fs::path& dir) { return " --set run.dir='" + dir.string() + "' --no-progress"; }

// A DDP job of 100,000 steps started by `kiln launch -n 2` in the background, once training runs
// (rank 0 has written metrics): the launcher's pid, rank 1's and the launcher's log.
struct long_job {
  pid_t launcher = -1, rank1 = -1;
  std::string log;
};

long_job start_long_job(const kiln::test::temp_dir& dir, int timeout_s, int grace_s) {
  const auto recipe =
      dir.write("long.toml", job("kind = \"ddp\"\ntimeout_s = " + std::to_string(timeout_s), adamw, 32, 100000));
  long_job started;
  started.log = (dir.path / "launch.log").string();
  const std::string command = "cd '" KILN_SOURCE_DIR "' && OMP_WAIT_POLICY=PASSIVE exec '" KILN_CLI "' launch -n 2 '" +
                              recipe.string() + "' --grace " + std::to_string(grace_s) + run_dir_option(dir.path / "run") +
                              " > '" + started.log + "' 2>&1";
  started.launcher = ::fork();
  REQUIRE(started.launcher >= 0);
  if (started.launcher == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto metrics = dir.path / "run" / "metrics.jsonl";
  for (int i = 0; i < 600 && !(fs::exists(metrics) && fs::file_size(metrics) > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(fs::exists(metrics), read_file(started.log));
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const auto stat = read_file(entry.path() / "stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    char state;
    pid_t parent = 0;
    fields >> state >> parent;
    if (parent != started.launcher) continue;
    const auto environment = '\0' + read_file(entry.path() / "environ");  // NUL-separated NAME=value
    if (environment.find(std::string("\0RANK=1\0", 8)) != std::string::npos)
      started.rank1 = static_cast<pid_t>(std::stoi(entry.path().filename().string()));
  }
  REQUIRE(started.rank1 > 0);
  return started;
}

// Sends `signal` to the job's rank 1 and waits for the launcher: its exit status, the seconds
// from the signal to its exit, and its log.
struct job_end {
  int status = 0;
  double seconds = 0;
  std::string output;
};

job_end signal_rank1(const long_job& job, int signal) {
  const auto sent = std::chrono::steady_clock::now();
  ::kill(job.rank1, signal);
  job_end end;
  ::waitpid(job.launcher, &end.status, 0);
  end.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  end.output = read_file(job.log);
  return end;
}

// One of tests/sharding/recipes' small checkpointed GPT jobs (all but single-* under `kiln launch
// -n 2`), run into dir/name by the test CLI, which has their combinations compiled.
fs::path run_checkpointed_gpt(const fs::path& dir, const std::string& recipe, const std::string& name,
                              const std::string& extra = "") {
  const bool one_process = recipe.rfind("single", 0) == 0;
  auto result = kiln_cli(std::string(one_process ? "run '" : "launch -n 2 '") + KILN_SOURCE_DIR "/tests/sharding/recipes/" +
                             recipe + ".toml'" + extra + run_dir_option(dir / name),
                         KILN_TEST_CLI);
  REQUIRE_MESSAGE(result.status == 0, result.output);
  return dir / name;
}

// Between two runs of those jobs: embeddings, 2 blocks, final LayerNorm and head.
double difference(const fs::path& a, const fs::path& b) { return max_parameter_difference(a, b, 2 + 2 * 12 + 2 + 1); }

// One process taking each batch of 16 as 2 accumulated micro-batches of 8, as DDP's 2 ranks do,
// and how many times the parameter difference that split makes DDP may differ from one process
// under bf16 (where the rows of each half decide the rounding; see the bf16 tests).
const std::string split_in_two = " --set data.batch_size=8 --set accumulation.steps=2";
constexpr double split_tolerance = 4;

}  // namespace

TEST_SUITE("sharding") {
  TEST_CASE("buckets: reverse parameter order, a small first bucket like torch DDP's, one dtype each") {
    // A double parameter, then float ones of 100, 300, 200, 48 and 60 bytes; reverse order is
    // what backward produces first.
    std::vector<torch::Tensor> params = {torch::zeros({4}, torch::kDouble), torch::zeros({25}), torch::zeros({75}),
                                         torch::zeros({50}), torch::zeros({12}), torch::zeros({15})};
    const auto buckets = kiln::detail::make_buckets(params, /*cap_bytes=*/400, /*first_cap_bytes=*/100);
    std::vector<std::vector<std::size_t>> members;
    for (const auto& b : buckets) members.push_back(b.members);
    // First float bucket: 60 + 48 would pass 100, so 60 alone; then 48 + 200 (+300 would pass
    // 400); then 300 + 100 (exactly 400); then the double one, its dtype's first.
    const std::vector<std::vector<std::size_t>> expected = {{5}, {4, 3}, {2, 1}, {0}};
    CHECK(members == expected);
    CHECK(buckets[1].flat.numel() == 62);
    CHECK(buckets[1].offsets == std::vector<std::int64_t>{0, 12});
    CHECK(((buckets[3].flat.scalar_type() == torch::kDouble)));
    // Without a first cap, the first bucket takes 60 + 48 + 200.
    CHECK(kiln::detail::make_buckets(params, 400).front().members.size() == 3);
  }

  TEST_CASE("ddp: 2 ranks x 32 end with the parameters of 1 process x 64, one all-reduce per bucket per step") {
    kiln::test::temp_dir dir("ddp_equal");
    const auto ddp_recipe = dir.write("ddp.toml", job("kind = \"ddp\"\nbucket_mb = 0.002\nfirst_bucket_mb = 0.002", adamw, 32, 6));
    const auto single_recipe = dir.write("single.toml", job("kind = \"single\"", adamw, 64, 6));
    auto launched = kiln_cli("launch -n 2 '" + ddp_recipe.string() + "'" + run_dir_option(dir.path / "ddp"));
    REQUIRE_MESSAGE(launched.status == 0, launched.output);
    CHECK(launched.output.find("[rank 1]") != std::string::npos);
    auto single = kiln_cli("run '" + single_recipe.string() + "'" + run_dir_option(dir.path / "single"));
    REQUIRE_MESSAGE(single.status == 0, single.output);

    CHECK(max_parameter_difference(dir.path / "ddp", dir.path / "single") <= 1e-5);
    // 2 KB buckets split the 16-32-32-4 MLP's 1,732 parameters (6.9 KB) into several.
    const auto buckets = summary_field(dir.path / "ddp", "buckets");
    CHECK(buckets > 2);
    CHECK(summary_field(dir.path / "ddp", "gradient_allreduces") == 6 * buckets);
    CHECK(summary_field(dir.path / "ddp", "world_size") == 2);
    CHECK(parameter_bytes(dir.path / "ddp") == 1732 * 4);
    CHECK(summary_field(dir.path / "ddp", "collective_bytes") == 6 * parameter_bytes(dir.path / "ddp"));
    CHECK(summary_field(dir.path / "ddp", "allreduce_wait_s") >= 0);
  }

  TEST_CASE("torchrun starts kiln's ranks as kiln launch does: the same job, the same parameters") {
    if (!fs::exists("/usr/bin/torchrun")) {
      MESSAGE("skipped: torchrun (Debian's python3-torch) is not installed");
      return;
    }
    // Debian 13's torch (2.6) is built without libuv, yet torchrun's rendezvous always asks for
    // a libuv store (USE_LIBUV=0 does not reach it), so it cannot start any job there.
    const auto store = kiln_cli("-c 'import datetime, torch.distributed as d; "
                                "d.TCPStore(\"127.0.0.1\", 0, 1, True, datetime.timedelta(seconds=10))'",
                                "/usr/bin/python3");
    if (store.status != 0) {
      MESSAGE("skipped: this torchrun cannot start its own store: " << store.output);
      return;
    }
    kiln::test::temp_dir dir("torchrun");
    const auto recipe = dir.write("ddp.toml", job("kind = \"ddp\"", adamw, 32, 4));
    auto launched = kiln_cli("launch -n 2 '" + recipe.string() + "'" + run_dir_option(dir.path / "launch"));
    REQUIRE_MESSAGE(launched.status == 0, launched.output);
    // --no_python runs a program rather than a Python script. Debian's torchrun (1.13 under
    // Python 3.11) cannot parse its own default --redirects/--tee of 0 (an IntFlag change in 3.11);
    // 2 (stderr, also to the console) works with it and with 2.x.
    auto torchrun = kiln_cli("--standalone --nproc_per_node 2 --redirects 2 --tee 2 --no_python '" KILN_CLI "' run '" +
                                 recipe.string() + "'" + run_dir_option(dir.path / "torchrun"),
                             "/usr/bin/torchrun");
    REQUIRE_MESSAGE(torchrun.status == 0, torchrun.output);
    CHECK(summary_field(dir.path / "torchrun", "world_size") == 2);
    CHECK(max_parameter_difference(dir.path / "torchrun", dir.path / "launch") == 0);
  }

  TEST_CASE("ddp with accumulation: 2 ranks x 2 micro-batches x 16 equal 1 x 64, still one all-reduce per bucket") {
    kiln::test::temp_dir dir("ddp_accumulate");
    const auto ddp_recipe = dir.write("ddp.toml", job("kind = \"ddp\"\nbucket_mb = 0.002\nfirst_bucket_mb = 0.002", adamw, 16, 5, 2));
    const auto single_recipe = dir.write("single.toml", job("kind = \"single\"", adamw, 64, 5));
    auto launched = kiln_cli("launch -n 2 '" + ddp_recipe.string() + "'" + run_dir_option(dir.path / "ddp"));
    REQUIRE_MESSAGE(launched.status == 0, launched.output);
    auto single = kiln_cli("run '" + single_recipe.string() + "'" + run_dir_option(dir.path / "single"));
    REQUIRE_MESSAGE(single.status == 0, single.output);

    CHECK(max_parameter_difference(dir.path / "ddp", dir.path / "single") <= 1e-5);
    CHECK(summary_field(dir.path / "ddp", "gradient_allreduces") == 5 * summary_field(dir.path / "ddp", "buckets"));
  }

  TEST_CASE("ddp with activation checkpointing, in fp32 and under bf16: 2 ranks x 8 equal 1 process x 16") {
    // The gradient hooks fire from inside the checkpointed blocks' recomputation in backward.
    kiln::test::temp_dir dir("ddp_checkpointed");
    auto run = [&](const std::string& recipe, const std::string& name, const std::string& extra = "") {
      return run_checkpointed_gpt(dir.path, recipe, name, extra);
    };
    const auto ddp = run("ddp-checkpointed", "ddp"), single = run("single-checkpointed", "single");
    // Rank 0's half of each batch alone: what DDP would end with if it did not average.
    const auto half = run("single-checkpointed", "half", " --set data.batch_size=8");
    CHECK(difference(ddp, single) <= 1e-5);
    CHECK(difference(half, single) > 1e-2);

    // Under bf16 the runs round differently: a matmul's weight gradient is a sum over the batch's
    // rows rounded to bf16 once, over all 16 rows in one process and over each rank's 8 under DDP.
    // How far such a split moves the parameters is measured the same way on this machine: one
    // process taking the same 16 rows as 2 accumulated micro-batches of 8 rounds its two halves
    // separately too. DDP's halves are other rows (every 2nd sample), so it is held to a small
    // multiple of that, on any CPU, whatever its bf16 GEMM does.
    const auto ddp_bf16 = run("ddp-checkpointed-bf16", "ddp_bf16");
    const auto single_bf16 = run("single-checkpointed-bf16", "single_bf16");
    const auto split_bf16 = run("single-checkpointed-bf16", "split_bf16", split_in_two);
    const double ddp_error = difference(ddp_bf16, single_bf16), split_error = difference(split_bf16, single_bf16);
    MESSAGE("bf16: ddp vs one process ", ddp_error, "; one process split in two micro-batches ", split_error,
            "; bf16 vs fp32 ", difference(single_bf16, single));
    CHECK(split_error > 0);  // the runs are bf16: a split changes their rounding
    CHECK(ddp_error <= split_tolerance * split_error);
    // and far from what not averaging gives
    CHECK(ddp_error < 0.1 * difference(half, single));
  }

  TEST_CASE("ddp and local-sgd under bf16-pure, fp32 masters or Kahan: 2 ranks x 8 equal 1 process x 16, gradients sent as bf16 where Gloo sums bf16") {
    // bf16-pure turns the model bf16 after ddp has bucketed it: the buckets follow (attach()), so
    // the all-reduces carry bf16, or fp32 where this LibTorch's Gloo cannot sum bf16 (1.13).
    kiln::test::temp_dir dir("ddp_bf16_pure");
    const auto single = run_checkpointed_gpt(dir.path, "single-checkpointed", "single");
    const double wire_bytes = kiln::detail::gloo_sums_bfloat16() ? 2 : 4;
    const double steps = 4;  // the recipes' train.steps
    for (const std::string kahan : {"false", "true"}) {
      CAPTURE(kahan);
      const std::string pure = " --set precision.kind=bf16-pure --set precision.kahan=" + kahan;
      const auto ddp = run_checkpointed_gpt(dir.path, "ddp-checkpointed-bf16", "ddp_" + kahan, pure);
      const auto one = run_checkpointed_gpt(dir.path, "single-checkpointed-bf16", "single_" + kahan, pure);
      // The rounding a split of the batch brings, measured on this machine (see the test above).
      const auto split = run_checkpointed_gpt(dir.path, "single-checkpointed-bf16", "split_" + kahan, pure + split_in_two);
      const double ddp_error = difference(ddp, one), split_error = difference(split, one);
      MESSAGE("bf16-pure (kahan = ", kahan, "): ddp vs one process ", ddp_error, "; one process split in two ",
              split_error, "; vs fp32 ", difference(one, single));
      CHECK(split_error > 0);
      CHECK(ddp_error <= split_tolerance * split_error);
      // Every step all-reduces each gradient once: the fp32 model's parameter count times the
      // bytes of the dtype on the wire.
      CHECK(summary_field(ddp, "collective_bytes") == steps * parameter_bytes(single) / 4 * wire_bytes);

      // Local SGD averaging after every step is DDP's update under plain SGD, if what it averages
      // is what the optimizer updates (the masters; under Kahan the bf16 weights with their
      // compensations) and the average survives into the model. Rank 0's half of each batch
      // alone is what undone averages give.
      const auto local = run_checkpointed_gpt(dir.path, "local-sgd-checkpointed-bf16-pure", "local_" + kahan,
                                              " --set precision.kahan=" + kahan);
      const auto half = run_checkpointed_gpt(dir.path, "single-checkpointed-bf16", "half_" + kahan,
                                             pure + " --set data.batch_size=8");
      const double local_error = difference(local, one), half_error = difference(half, one);
      MESSAGE("local-sgd vs one process ", local_error, "; rank 0's half alone ", half_error);
      CHECK(local_error <= split_tolerance * split_error);
      CHECK(half_error > 10 * local_error);
      CHECK(summary_field(local, "parameter_averages") == steps);
    }
  }

  TEST_CASE("buckets carry bf16 as bf16 where Gloo sums it (LibTorch 2.2 on), widened to fp32 where it cannot (1.13)") {
    // kiln finds Gloo's answer by trying; it agrees with the release that added bf16 to Gloo.
    const int version = kiln::detail::torch_version_major * 100 + kiln::detail::torch_version_minor;
    CHECK(kiln::detail::gloo_sums_bfloat16() == (version >= 202));

    const std::vector<torch::Tensor> params = {torch::zeros({50}, torch::kBFloat16), torch::zeros({50}, torch::kBFloat16)};
    const auto narrow = kiln::detail::make_buckets(params, /*cap_bytes=*/300);
    REQUIRE(narrow.size() == 1);  // 100 bytes each
    CHECK((narrow[0].flat.scalar_type() == torch::kBFloat16));
    const auto widen = [](c10::ScalarType t) { return t == torch::kBFloat16 ? torch::kFloat : t; };
    const auto wide = kiln::detail::make_buckets(params, /*cap_bytes=*/300, -1, widen);
    REQUIRE(wide.size() == 2);  // 200 bytes each on the wire: the cap counts what travels
    CHECK((wide[0].flat.scalar_type() == torch::kFloat));
    // A widened slot takes a bf16 gradient and gives it back exactly.
    const auto grad = torch::randn({50}).to(torch::kBFloat16);
    wide[0].slot(0, grad).copy_(grad);
    CHECK(torch::equal(wide[0].slot(0, grad).to(torch::kBFloat16), grad));
  }

  TEST_CASE("ddp with token normalisation: padded sequences of uneven lengths across ranks equal one process") {
    // Sequences of 2 to 16 real tokens: the ranks' micro-batches hold different token counts, and
    // DDP must average gradients weighted by the job's count, as one process's mean over all of
    // the batch's tokens is.
    kiln::test::temp_dir dir("ddp_tokens");
    const std::string tokens = " --set accumulation.normalize=tokens --set data.min_len=2 --set train.steps=6";
    auto run = [&](const std::string& recipe, const std::string& name, const std::string& extra) {
      return run_checkpointed_gpt(dir.path, recipe, name, tokens + extra);
    };
    const auto single = run("single-checkpointed", "single", "");
    CHECK(difference(run("ddp-checkpointed", "ddp", ""), single) <= 1e-5);
    // And with 2 micro-batches of 4 per rank: the window's count is the job's too.
    CHECK(difference(run("ddp-checkpointed", "ddp_accumulated", " --set data.batch_size=4 --set accumulation.steps=2"),
                     single) <= 1e-5);
    // Each rank's mean, averaged (what "mean" does), is a different update.
    CHECK(difference(run("ddp-checkpointed", "ddp_mean", " --set accumulation.normalize=mean"), single) > 1e-3);
  }

  TEST_CASE("ddp: BatchNorm statistics follow rank 0's, so every rank evaluates the model rank 0 saves") {
    if (!fs::exists(fs::path(kiln::data::default_fashion_mnist_dir) / "t10k-images-idx3-ubyte.gz")) {
      MESSAGE("skipped: Debian's dataset-fashion-mnist is not installed");
      return;
    }
    kiln::test::temp_dir dir("ddp_buffers");
    const auto recipe = dir.write(
        "cnn.toml",
        "[recipe]\nname = \"bn\"\n"
        "[model]\nkind = \"cnn\"\nchannels = [4]\nhidden = 16\ndropout = 0.0\n"
        "[data]\nkind = \"fashion-mnist\"\nbatch_size = 16\n"
        "[train]\nsteps = 4\nthreads = 1\nlog_every = 1\n"
        "[sharding]\nkind = \"ddp\"\n"
        "[optimizer]\n" + adamw + "\n");
    // The evaluation loss of rank 0's saved model on the whole test split, in this process.
    auto saved_model_loss = [&](const fs::path& run) {
      kiln::models::cnn model(kiln::models::cnn_settings{.channels = {4}, .hidden = 16, .dropout = 0.0});
      kiln::load_module(*model, kiln::load_state_file(run / "state.pt"), "model/");
      model->eval();
      torch::NoGradGuard no_grad;
      const auto test = kiln::data::load_fashion_mnist(kiln::data::default_fashion_mnist_dir, kiln::data::split::test);
      double sum = 0;
      for (std::int64_t begin = 0; begin < test.inputs.size(0); begin += 1000) {
        const auto logits = model->forward(test.inputs.slice(0, begin, begin + 1000));
        sum += torch::nn::functional::cross_entropy(logits, test.targets.slice(0, begin, begin + 1000),
                                                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
      }
      return sum / static_cast<double>(test.inputs.size(0));
    };
    for (const bool broadcast : {true, false}) {
      CAPTURE(broadcast);
      const auto run = dir.path / (broadcast ? "broadcast" : "own");
      auto launched = kiln_cli("launch -n 2 '" + recipe.string() + "'" + run_dir_option(run) +
                               (broadcast ? "" : " --set sharding.broadcast_buffers=false"));
      REQUIRE_MESSAGE(launched.status == 0, launched.output);
      // Each rank evaluated half of the test split with its own statistics.
      const double reported = summary_field(run, "eval_loss"), saved = saved_model_loss(run);
      MESSAGE("eval loss reported by the ranks ", reported, ", of rank 0's model ", saved);
      if (broadcast) CHECK(std::abs(reported - saved) <= 2e-6 * saved);
      else CHECK(std::abs(reported - saved) > 1e-4 * saved);
    }
  }

  TEST_CASE("local-sgd: sync_every = 1 equals one process on the global batch, sync_every = 4 averages 4x less") {
    kiln::test::temp_dir dir("local_sgd");
    const auto every_step = dir.write("every1.toml", job("kind = \"local-sgd\"\nsync_every = 1", sgd, 32, 8));
    const auto every_4 = dir.write("every4.toml", job("kind = \"local-sgd\"\nsync_every = 4", sgd, 32, 8));
    const auto single_recipe = dir.write("single.toml", job("kind = \"single\"", sgd, 64, 8));
    for (const auto& [recipe, run] : {std::pair{every_step, "every1"}, {every_4, "every4"}}) {
      auto launched = kiln_cli("launch -n 2 '" + recipe.string() + "'" + run_dir_option(dir.path / run));
      REQUIRE_MESSAGE(launched.status == 0, launched.output);
    }
    auto single = kiln_cli("run '" + single_recipe.string() + "'" + run_dir_option(dir.path / "single"));
    REQUIRE_MESSAGE(single.status == 0, single.output);

    // SGD with momentum is linear in the gradients: averaging parameters after every step is
    // averaging gradients before it.
    CHECK(max_parameter_difference(dir.path / "every1", dir.path / "single") <= 1e-5);
    CHECK(max_parameter_difference(dir.path / "every4", dir.path / "single") > 1e-4);  // replicas drift between averages
    CHECK(summary_field(dir.path / "every1", "parameter_averages") == 8);
    CHECK(summary_field(dir.path / "every4", "parameter_averages") == 2);
    // A full set of parameters per average: 4x fewer bytes than DDP's all-reduce every step.
    CHECK(summary_field(dir.path / "every4", "collective_bytes") == 2 * parameter_bytes(dir.path / "every4"));
    CHECK(summary_field(dir.path / "every1", "collective_bytes") == 8 * parameter_bytes(dir.path / "every1"));
  }

  TEST_CASE("zero1: 2 and 3 ranks take ddp's steps exactly, hold 1/N of AdamW's state each, save it whole") {
    kiln::test::temp_dir dir("zero1");
    const std::string small_buckets = "\nbucket_mb = 0.002\nfirst_bucket_mb = 0.002";
    auto launch = [&](int ranks, const std::string& sharding, const std::string& name, std::int64_t batch) {
      const auto recipe = dir.write(name + ".toml", job("kind = \"" + sharding + "\"" + small_buckets, adamw, batch, 6));
      auto launched = kiln_cli("launch -n " + std::to_string(ranks) + " '" + recipe.string() + "'" +
                               run_dir_option(dir.path / name));
      REQUIRE_MESSAGE(launched.status == 0, launched.output);
    };
    launch(2, "zero1", "zero1-2", 32);
    launch(2, "ddp", "ddp-2", 32);
    launch(3, "zero1", "zero1-3", 16);
    const auto single_recipe = dir.write("single.toml", job("kind = \"single\"", adamw, 64, 6));
    auto single = kiln_cli("run '" + single_recipe.string() + "'" + run_dir_option(dir.path / "single"));
    REQUIRE_MESSAGE(single.status == 0, single.output);

    // The same averaged gradients, the same elementwise update: bit for bit ddp's parameters, and
    // the saved (gathered) moments are ddp's, shape for shape.
    CHECK(max_parameter_difference(dir.path / "zero1-2", dir.path / "ddp-2") == 0);
    CHECK(max_optimizer_state_difference(dir.path / "zero1-2", dir.path / "ddp-2") == 0);
    CHECK(max_parameter_difference(dir.path / "zero1-2", dir.path / "single") <= 1e-5);
    // 3 ranks x 16 is not the single run's batch of 64: checked against one process of 48.
    const auto single48 = dir.write("single48.toml", job("kind = \"single\"", adamw, 48, 6));
    auto single3 = kiln_cli("run '" + single48.string() + "'" + run_dir_option(dir.path / "single48"));
    REQUIRE_MESSAGE(single3.status == 0, single3.output);
    CHECK(max_parameter_difference(dir.path / "zero1-3", dir.path / "single48") <= 1e-5);

    // AdamW keeps 8 bytes per parameter: ddp's rank 0 all of them, zero1's its rows. At 3 ranks
    // rows split unevenly (32 rows: 11, 11, 10; the head's 4: 2, 2, 0), hence the 10% margin.
    const auto whole = summary_field(dir.path / "ddp-2", "optimizer_state_bytes");
    CHECK(whole == 1732 * 8);
    CHECK(summary_field(dir.path / "zero1-2", "optimizer_state_bytes") == whole / 2);
    CHECK(summary_field(dir.path / "zero1-3", "optimizer_state_bytes") <= whole / 3 * 1.1);
    // ddp's all-reduce of the gradients plus an all-gather of this rank's (padded) rows.
    CHECK(summary_field(dir.path / "zero1-2", "collective_bytes") == 6 * 1.5 * parameter_bytes(dir.path / "zero1-2"));
    CHECK(summary_field(dir.path / "zero1-2", "gradient_allreduces") == 6 * summary_field(dir.path / "zero1-2", "buckets"));
  }

  TEST_CASE("zero1: a run stopped and resumed continues to the parameters of an uninterrupted one") {
    kiln::test::temp_dir dir("zero1_resume");
    const auto recipe = dir.write("zero1.toml", job("kind = \"zero1\"", adamw, 32, 6));
    auto launch = [&](const std::string& name, std::int64_t steps) {
      auto launched = kiln_cli("launch -n 2 '" + recipe.string() + "' --set train.steps=" + std::to_string(steps) +
                               run_dir_option(dir.path / name));
      REQUIRE_MESSAGE(launched.status == 0, launched.output);
      return launched.output;
    };
    launch("straight", 6);
    launch("resumed", 3);
    fs::remove(dir.path / "resumed" / "summary.json");  // unfinished: the next launch resumes it
    CHECK(launch("resumed", 6).find("resuming") != std::string::npos);
    CHECK(max_parameter_difference(dir.path / "resumed", dir.path / "straight") == 0);
    CHECK(max_optimizer_state_difference(dir.path / "resumed", dir.path / "straight") == 0);
  }

  TEST_CASE("zero1 with activation checkpointing, in fp32 and bf16-pure (masters or Kahan), with accumulation: ddp's parameters exactly") {
    kiln::test::temp_dir dir("zero1_checkpointed");
    auto run = [&](const std::string& recipe, const std::string& name, const std::string& extra = "") {
      return run_checkpointed_gpt(dir.path, recipe, name, extra);
    };
    CHECK(difference(run("zero1-checkpointed", "zero1"), run("ddp-checkpointed", "ddp")) == 0);
    // Accumulation: the gradients of a window are averaged once, at its end, as ddp does.
    const std::string accumulate = " --set data.batch_size=4 --set accumulation.steps=2";
    CHECK(difference(run("zero1-checkpointed", "zero1_acc", accumulate), run("ddp-checkpointed", "ddp_acc", accumulate)) == 0);
    for (const std::string kahan : {"false", "true"}) {
      CAPTURE(kahan);
      // The optimizer updates its rows of the fp32 masters (or of the bf16 weights, with their
      // compensations); the gathered masters are rounded into the model as without sharding.
      const std::string pure = " --set precision.kind=bf16-pure --set precision.kahan=" + kahan;
      CHECK(difference(run("zero1-checkpointed", "zero1_" + kahan, pure), run("ddp-checkpointed-bf16", "ddp_" + kahan, pure)) == 0);
    }
  }

  TEST_CASE("zero1 refuses an optimizer whose update is not elementwise, saying why") {
    kiln::test::temp_dir dir("zero1_adafactor");
    auto launched = kiln_cli("launch -n 2 '" KILN_SOURCE_DIR "/tests/sharding/recipes/zero1-checkpointed.toml' "
                             "--set optimizer.kind=adafactor" + run_dir_option(dir.path / "run"),
                             KILN_TEST_CLI);
    CHECK(launched.status != 0);
    CHECK_MESSAGE(launched.output.find("elementwise (sgd, adamw, lion)") != std::string::npos, launched.output);
  }

  TEST_CASE("kiln launch: a rank killed mid-run stops the job, non-zero, within the grace period") {
    kiln::test::temp_dir dir("launch_kill");
    const auto [status, seconds, output] = signal_rank1(start_long_job(dir, /*timeout_s=*/20, /*grace_s=*/15), SIGKILL);
    CHECK_MESSAGE(seconds < 20, output);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) != 0);
    CHECK_MESSAGE(output.find("kiln launch: rank 1 was killed by signal") != std::string::npos, output);
  }

  TEST_CASE("kiln launch: a rank that hangs mid-run fails the job, non-zero, within the timeout") {
    // SIGSTOP: the process lives and its sockets stay open, so only the timeout can notice it.
    kiln::test::temp_dir dir("launch_hang");
    const auto [status, seconds, output] = signal_rank1(start_long_job(dir, /*timeout_s=*/4, /*grace_s=*/3), SIGSTOP);
    MESSAGE("the job ended ", seconds, " s after rank 1 stopped");
    CHECK_MESSAGE(seconds < 4 + 3 + 10, output);  // timeout + grace + start-up slack
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) != 0);
    // Rank 0's collective names itself and the collective; the launcher names the failed rank.
    CHECK_MESSAGE(output.find("rank 0 of 2: allreduce") != std::string::npos, output);
    CHECK_MESSAGE(output.find("kiln launch: rank 0 exited with status") != std::string::npos, output);
    CHECK_MESSAGE(output.find("kiln launch: rank 1 did not stop within 3 s; killing it") != std::string::npos, output);
  }

  TEST_CASE("ddp outside a launch, torchrun variables that do not add up, and NCCL without NCCL are errors that say so") {
    kiln::test::temp_dir dir("ddp_errors");
    const auto recipe = dir.write("ddp.toml", job("kind = \"ddp\"", adamw, 32, 2));
    auto alone = kiln_cli("run '" + recipe.string() + "'" + run_dir_option(dir.path / "run"));
    CHECK(alone.status != 0);
    CHECK_MESSAGE(alone.output.find("needs its ranks started together: run `kiln launch -n N RECIPE`") !=
                      std::string::npos,
                  alone.output);
    auto skewed = kiln_cli("run '" + recipe.string() + "'" + run_dir_option(dir.path / "run2") +
                           " ; RANK=2 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 '" +
                           KILN_CLI "' run '" + recipe.string() + "'");
    CHECK_MESSAGE(skewed.output.find("RANK='2': expected an integer from 0 to 1") != std::string::npos, skewed.output);
    // NCCL asked for where LibTorch has none (Debian's is CPU-only): refused with the reason, even
    // under a launch; "auto" falls back to Gloo, which the other tests run on.
    if (!kiln::detail::nccl_built) {
      auto nccl = kiln_cli("launch -n 2 '" + recipe.string() + "'" + run_dir_option(dir.path / "nccl") +
                           " --set sharding.backend=nccl");
      CHECK(nccl.status != 0);
      CHECK_MESSAGE(nccl.output.find("[sharding] backend = \"nccl\": this build of LibTorch has no NCCL") !=
                        std::string::npos,
                    nccl.output);
    }
    auto typo = kiln_cli("run '" + recipe.string() + "'" + run_dir_option(dir.path / "typo") +
                         " --set sharding.backend=ncl");
    CHECK(typo.status != 0);
    CHECK_MESSAGE(typo.output.find("sharding.backend") != std::string::npos, typo.output);
  }
}
