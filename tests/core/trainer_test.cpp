// The trainer: exact resume (in process and after kill -9), callbacks that stop, metrics,
// evaluation against a hand computation, and saves that survive a failed write.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <iterator>
#include <fstream>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

using trainer_t = kiln::trainer<kiln::optim::adamw>;

fs::path fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("kiln-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

struct setup {
  kiln::models::mlp model;
  kiln::data::batch_loader loader;
  kiln::data::tensor_pair eval;
  explicit setup(std::uint64_t init_seed)
      : model((torch::manual_seed(init_seed),
               kiln::models::mlp_settings{.in_features = 16, .hidden = {64, 32}, .classes = 4, .dropout = 0.2})),
        loader(kiln::data::make_classification(640, 16, 4, 9), {.batch_size = 32, .seed = 5}),
        eval(kiln::data::make_classification(200, 16, 4, 10)) {}
};

trainer_t::settings settings_for(const fs::path& dir, std::int64_t steps) {
  trainer_t::settings s;
  s.accelerator.optimizer.lr = 3e-3;
  s.accelerator.scheduler = kiln::schedules::cosine{.warmup_steps = 5};
  s.accelerator.clip_grad_norm = 1.0;
  s.options.steps = steps;
  s.options.log_every = 5;
  s.options.eval_every = 25;
  s.options.run_dir = dir;
  s.options.progress = false;
  s.options.fingerprint = "test";
  return s;
}

std::vector<std::string> loss_lines(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    // drop the timing field, which differs between runs
    auto at = line.find(", \"steps_per_s\"");
    out.push_back(at == std::string::npos ? line : line.substr(0, at));
  }
  return out;
}

// A model whose forward LibTorch refuses: x [batch, 16] times a weight [4, 16] not transposed.
struct wrong_matmulImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  wrong_matmulImpl() : fc(register_module("fc", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::mm(x, fc->weight); }
};
TORCH_MODULE(wrong_matmul);

// The failing op is two modules down, inside a Sequential.
struct nested_mismatchImpl : torch::nn::Module {
  torch::nn::Sequential body{nullptr};
  nested_mismatchImpl()
      : body(register_module("body", torch::nn::Sequential(torch::nn::Linear(16, 8), torch::nn::ReLU(),
                                                            torch::nn::Linear(4, 4)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
};
TORCH_MODULE(nested_mismatch);

// The forward's own code throws, after an op has run.
struct own_checkImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  own_checkImpl() : fc(register_module("fc", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = fc->forward(x);
    TORCH_CHECK(y.size(1) == 5, "own_check wants 5 features, got ", y.size(1));
    return y;
  }
};
TORCH_MODULE(own_check);

}  // namespace

TEST_SUITE("trainer") {
  TEST_CASE("a run directory: written afresh, resumed only from a saved state of the same recipe, older runs kept") {
    const auto dir = fresh_dir("run-directory");
    const kiln::run_directory first(dir, "[recipe]\nname = \"a\"\n", "model: mlp\n");
    CHECK_FALSE(first.open(true));  // nothing there: a fresh run
    CHECK(kiln::detail::read_text(dir / "recipe.toml") == "[recipe]\nname = \"a\"\n");
    CHECK(kiln::detail::read_text(dir / "fingerprint.txt") == "model: mlp\n");
    CHECK_FALSE(first.has_state());
    first.save_state({{"w", torch::arange(3)}});
    REQUIRE(first.has_state());
    CHECK(torch::equal(first.load_state().at("w"), torch::arange(3)));

    // The same recipe with a saved state, unfinished: resumed, nothing moved.
    CHECK(first.open(true));
    CHECK_FALSE(fs::exists(fs::path(dir.string() + ".1")));
    // Another recipe: refused, naming the first line that differs; the run stays as it was.
    const kiln::run_directory other(dir, "[recipe]\nname = \"b\"\n", "model: cnn\n");
    CHECK_THROWS_WITH_AS(other.open(true), doctest::Contains("saved: \"model: mlp\", now: \"model: cnn\""),
                         kiln::config_error);
    CHECK(first.has_state());
    // resume = never, or a finished run: the old one is moved aside and the directory starts afresh.
    CHECK_FALSE(other.open(false));
    CHECK(fs::exists(fs::path(dir.string() + ".1") / "state.pt"));
    CHECK(kiln::detail::read_text(dir / "fingerprint.txt") == "model: cnn\n");
    other.save_state({{"w", torch::zeros(1)}});
    other.write_summary(kiln::json_line().add("steps", std::int64_t{1}));
    CHECK_FALSE(other.open(true));  // finished: never resumed
    CHECK(fs::exists(fs::path(dir.string() + ".2") / "summary.json"));
    for (const auto* suffix : {"", ".1", ".2"}) fs::remove_all(dir.string() + suffix);
  }

  TEST_CASE("2N steps straight equal N steps, stop, resume, N steps") {
    const std::int64_t n = 30;
    std::map<std::int64_t, double> straight, resumed;

    auto dir_a = fresh_dir("straight");
    {
      setup s(1);
      trainer_t t(settings_for(dir_a, 2 * n));
      t.add_callback(kiln::on_step_end([&](const kiln::step_info& i) {
        straight[i.step] = i.loss;
        return kiln::control::proceed;
      }));
      auto summary = t.fit(s.model, s.loader, &s.eval);
      CHECK(summary.steps == 2 * n);
      CHECK_FALSE(summary.stopped_early);
    }
    auto dir_b = fresh_dir("resumed");
    {
      setup s(1);
      trainer_t t(settings_for(dir_b, 2 * n));
      t.add_callback(kiln::on_step_end([&](const kiln::step_info& i) {
        resumed[i.step] = i.loss;
        return i.step == n ? kiln::control::stop : kiln::control::proceed;
      }));
      auto summary = t.fit(s.model, s.loader, &s.eval);
      CHECK(summary.steps == n);
      CHECK(summary.stopped_early);
      CHECK_FALSE(fs::exists(dir_b / "summary.json"));
    }
    {
      setup s(999);  // different initial weights: everything must come from the saved state
      trainer_t t(settings_for(dir_b, 2 * n));
      t.add_callback(kiln::on_step_end([&](const kiln::step_info& i) {
        CHECK(i.step > n);
        resumed[i.step] = i.loss;
        return kiln::control::proceed;
      }));
      auto summary = t.fit(s.model, s.loader, &s.eval);
      CHECK(summary.steps == 2 * n);
    }
    REQUIRE(resumed.size() == straight.size());
    for (auto [step, loss] : straight) CHECK(resumed[step] == doctest::Approx(loss).epsilon(1e-6));
    CHECK(loss_lines(dir_a / "metrics.jsonl") == loss_lines(dir_b / "metrics.jsonl"));
    fs::remove_all(dir_a);
    fs::remove_all(dir_b);
  }

  // 20 batches per epoch, windows of 8: the epoch's last 4 batches are one short window when
  // stepped, and are skipped when dropped; either way a window never spans two epochs.
  TEST_CASE("an epoch's last, partial accumulation window is stepped or dropped by setting") {
    using kiln::accumulation::partial_window;
    for (const auto epoch_end : {partial_window::step, partial_window::drop}) {
      setup s(1);
      auto settings = settings_for({}, 4);
      settings.accelerator.accumulation = {.steps = 8, .epoch_end = epoch_end};
      trainer_t t(settings);
      std::vector<std::pair<std::int64_t, std::int64_t>> positions;  // (epoch, batch) after each step
      struct record : kiln::callback {
        kiln::data::batch_loader* loader;
        std::vector<std::pair<std::int64_t, std::int64_t>>* out;
        kiln::control on_step_end(const kiln::step_info&) override {
          out->emplace_back(loader->epoch(), loader->batch_in_epoch());
          return kiln::control::proceed;
        }
      };
      auto cb = std::make_shared<record>();
      cb->loader = &s.loader;
      cb->out = &positions;
      t.add_callback(cb);
      t.fit(s.model, s.loader);
      using pos = std::vector<std::pair<std::int64_t, std::int64_t>>;
      if (epoch_end == partial_window::step) CHECK((positions == pos{{0, 8}, {0, 16}, {0, 20}, {1, 8}}));
      else CHECK((positions == pos{{0, 8}, {0, 16}, {1, 8}, {1, 16}}));
      CHECK(kiln::optimizer_steps_per_epoch(t.accel().accumulation(), 20) == (epoch_end == partial_window::step ? 3 : 2));
    }
  }

  TEST_CASE("a resume into a run of a different recipe is refused") {
    auto dir = fresh_dir("other");
    {
      setup s(1);
      trainer_t t(settings_for(dir, 20));
      t.add_callback(kiln::on_step_end([](const kiln::step_info& i) {
        return i.step == 5 ? kiln::control::stop : kiln::control::proceed;
      }));
      t.fit(s.model, s.loader);
    }
    setup s(1);
    auto settings = settings_for(dir, 20);
    settings.options.fingerprint = "another";
    trainer_t t(settings);
    CHECK_THROWS_WITH_AS(t.fit(s.model, s.loader), doctest::Contains("holds a run of a different recipe"),
                         kiln::config_error);
    fs::remove_all(dir);
  }

  TEST_CASE("metrics.jsonl has a line per log interval and per evaluation") {
    auto dir = fresh_dir("metrics");
    setup s(2);
    trainer_t t(settings_for(dir, 50));
    auto summary = t.fit(s.model, s.loader, &s.eval);
    auto lines = loss_lines(dir / "metrics.jsonl");
    int train_lines = 0, eval_lines = 0;
    for (const auto& l : lines) (l.find("eval_accuracy") != std::string::npos ? eval_lines : train_lines)++;
    CHECK(train_lines == 10);
    CHECK(eval_lines == 2);
    CHECK(lines.front().rfind("{\"step\": 5, \"epoch\": 0, \"loss\": ", 0) == 0);
    CHECK(fs::exists(dir / "summary.json"));
    CHECK(fs::exists(dir / "recipe.toml"));
    CHECK(summary.evaluated);
    fs::remove_all(dir);
  }

  TEST_CASE("evaluate() equals a hand computation of loss and accuracy, padding targets left out") {
    setup s(3);
    trainer_t t(settings_for({}, 1));
    auto info = t.evaluate(s.model, s.eval);
    s.model->eval();
    torch::NoGradGuard no_grad;
    auto logits = s.model->forward(s.eval.inputs);
    CHECK(info.loss == doctest::Approx(torch::nn::functional::cross_entropy(logits, s.eval.targets).item<double>()));
    CHECK(info.accuracy == doctest::Approx(logits.argmax(1).eq(s.eval.targets).to(torch::kFloat64).mean().item<double>()));
    CHECK(info.samples == 200);

    // Padding targets (-100, the ignore index) are neither scored nor counted: the loss and the
    // accuracy are over the other 150 samples.
    auto padded = s.eval;
    padded.targets = s.eval.targets.clone();
    padded.targets.slice(0, 0, 50) = -100;
    auto masked = t.evaluate(s.model, padded);
    const auto real = logits.slice(0, 50);
    const auto real_targets = s.eval.targets.slice(0, 50);
    CHECK(masked.loss == doctest::Approx(torch::nn::functional::cross_entropy(real, real_targets).item<double>()));
    CHECK(masked.accuracy == doctest::Approx(real.argmax(1).eq(real_targets).to(torch::kFloat64).mean().item<double>()));
    CHECK(masked.samples == 150);
  }

  TEST_CASE("evaluate() over a dataset or a loader equals it over the tensor pair, and fit() evaluates any of them") {
    setup s(3);
    trainer_t t(settings_for({}, 1));
    t.accel().prepare(*s.model);
    const auto reference = t.evaluate(s.model, s.eval);

    // A dataset that neither slices nor gathers: batches are stacked from get(), 64 at a time.
    struct one_by_one {
      kiln::data::tensor_pair data;
      std::int64_t size() const { return data.inputs.size(0); }
      kiln::data::example get(std::int64_t i) const { return {data.inputs[i], data.targets[i]}; }
    };
    auto settings = settings_for({}, 1);
    settings.options.eval_batch_size = 64;  // 200 samples: 3 full batches and one of 8
    trainer_t small_batches(settings);
    small_batches.accel().prepare(*s.model);
    const auto from_dataset = small_batches.evaluate(s.model, one_by_one{s.eval});
    CHECK(from_dataset.samples == 200);
    CHECK(from_dataset.loss == doctest::Approx(reference.loss).epsilon(1e-6));
    CHECK(from_dataset.accuracy == doctest::Approx(reference.accuracy));

    // A loader: one epoch of its batches; a second evaluation sees the same ones.
    kiln::data::batch_loader eval_loader(s.eval, {.batch_size = 48, .shuffle = false, .drop_last = false});
    for (int pass = 0; pass < 2; ++pass) {
      const auto from_loader = t.evaluate(s.model, eval_loader);
      CHECK(from_loader.samples == 200);
      CHECK(from_loader.loss == doctest::Approx(reference.loss).epsilon(1e-6));
      CHECK(from_loader.accuracy == doctest::Approx(reference.accuracy));
    }

    // fit() with a dataset to evaluate on, as a callback sees it.
    std::vector<double> seen;
    trainer_t fitting(settings_for({}, 10));
    fitting.add_callback(kiln::on_eval([&](const kiln::eval_info& e) {
      seen.push_back(e.loss);
      return kiln::control::proceed;
    }));
    const one_by_one eval_set{s.eval};
    const auto summary = fitting.fit(s.model, s.loader, &eval_set);
    REQUIRE(seen.size() == 1);  // at the last step (eval_every = 25)
    CHECK(summary.final_eval.loss == doctest::Approx(fitting.evaluate(s.model, s.eval).loss).epsilon(1e-6));
  }

  TEST_CASE("a failed write leaves the previous state file intact") {
    auto dir = fresh_dir("atomic");
    fs::create_directories(dir);
    const auto file = dir / "state.pt";
    kiln::state_dict good{{"w", torch::arange(10, torch::kFloat32)}};
    kiln::save_state_file(file, good);

    pid_t child = ::fork();
    if (child == 0) {
      // A file-size limit makes the write fail part-way, as a full disk would.
      std::signal(SIGXFSZ, SIG_IGN);
      rlimit limit{4096, 4096};
      ::setrlimit(RLIMIT_FSIZE, &limit);
      kiln::state_dict big{{"w", torch::randn({100000})}};
      try {
        kiln::save_state_file(file, big);
      } catch (const kiln::state_error&) {
        ::_exit(0);
      }
      ::_exit(1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    auto loaded = kiln::load_state_file(file);
    CHECK(torch::equal(loaded.at("w"), good.at("w")));
    CHECK_FALSE(fs::exists(dir / "state.pt.tmp"));
    fs::remove_all(dir);
  }

  TEST_CASE("a run killed with SIGKILL resumes to the same metrics as an uninterrupted one") {
    auto root = fresh_dir("kill");
    fs::create_directories(root);
    const auto recipe = root / "kill.toml";
    std::ofstream(recipe) << "[recipe]\nname = \"kill\"\n"
                             "[model]\nkind = \"mlp\"\nin_features = 32\nhidden = [256, 256]\nclasses = 4\ndropout = 0.1\n"
                             "[data]\nkind = \"synthetic-classification\"\nfeatures = 32\nclasses = 4\nbatch_size = 64\n"
                             "[train]\nsteps = 1200\nlog_every = 10\nthreads = 1\n"
                             "[optimizer]\nkind = \"adamw\"\n[scheduler]\nkind = \"cosine\"\n"
                             "[run]\nsave_every = 40\n";
    auto run = [&](const fs::path& dir) {
      pid_t pid = ::fork();
      if (pid == 0) {
        ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        const std::string set_dir = "run.dir=" + dir.string();
        ::execl(KILN_CLI, KILN_CLI, "run", recipe.c_str(), "--set", set_dir.c_str(), "--no-progress", (char*)nullptr);
        ::_exit(127);
      }
      return pid;
    };
    auto wait_ok = [](pid_t pid) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    };

    REQUIRE(wait_ok(run(root / "straight")));

    const auto dir = root / "killed";
    pid_t victim = run(dir);
    // Kill it once it has saved at least twice and is somewhere between two saves.
    bool killed = false;
    for (int i = 0; i < 4000 && !killed; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (fs::exists(dir / "metrics.jsonl") && loss_lines(dir / "metrics.jsonl").size() >= 10) {
        ::kill(victim, SIGKILL);
        killed = true;
      }
    }
    int status = 0;
    ::waitpid(victim, &status, 0);
    REQUIRE(killed);
    REQUIRE(WIFSIGNALED(status));
    CHECK_FALSE(fs::exists(dir / "summary.json"));
    REQUIRE(wait_ok(run(dir)));  // resume = "auto" by default
    CHECK(loss_lines(root / "straight" / "metrics.jsonl") == loss_lines(dir / "metrics.jsonl"));
    fs::remove_all(root);
  }
}

TEST_SUITE("trainer") {
  TEST_CASE("fit takes a temporary AnyModule, and callbacks print lines that stay through the progress display") {
    setup s(3);
    auto settings = settings_for({}, 30);
    trainer_t t(settings);
    t.add_callback(kiln::on_step_end([](const kiln::step_info& i) {
      if (i.step == 3) i.print("callback line at step 3");
      return kiln::control::proceed;
    }));
    t.add_callback(kiln::on_eval([](const kiln::eval_info& e) {
      e.print("callback saw the evaluation at step " + std::to_string(e.step));
      return kiln::control::proceed;
    }));
    // stderr into a file for the length of fit().
    const auto file = fresh_dir("printed");
    std::fflush(stderr);
    const int saved = ::dup(2);
    const int into = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(into, 2);
    const auto summary = t.fit(torch::nn::AnyModule(s.model), s.loader, &s.eval);
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(into);
    ::close(saved);
    std::ifstream in(file);
    const std::string printed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(file);
    CHECK(summary.steps == 30);
    CHECK_MESSAGE(printed.find("callback line at step 3\n") != std::string::npos, printed);
    CHECK_MESSAGE(printed.find("callback saw the evaluation at step 25\n") != std::string::npos, printed);
    CHECK_MESSAGE(printed.find("callback saw the evaluation at step 30\n") != std::string::npos, printed);
  }

  TEST_CASE("an error inside a step is a kiln::step_error naming the step, the phase, the op and the module, without a backtrace") {
    setup s(4);
    wrong_matmul model;
    trainer_t t(settings_for({}, 5));
    std::string message;
    try {
      t.fit(model, s.loader);
    } catch (const kiln::step_error& e) {
      message = e.what();
    }
    // The module is found by running the forward again under observation: fc's weight is an
    // input of the op that threw.
    CHECK_MESSAGE(message.rfind("step 1, forward (model and loss), in aten::mm of module fc: ", 0) == 0, message);
    CHECK_MESSAGE(message.find("(32x16 and 4x16)") != std::string::npos, message);  // LibTorch's own words
    CHECK_MESSAGE(message.find("Exception raised from") == std::string::npos, message);  // no C++ backtrace
  }

  TEST_CASE("a step error names the module of a nested failing op, or the module before the forward's own check") {
    auto message_of = [](auto model) {
      setup s(4);
      trainer_t t(settings_for({}, 5));
      try {
        t.fit(model, s.loader);
      } catch (const kiln::step_error& e) {
        return std::string(e.what());
      }
      return std::string("no step_error");
    };
    const auto nested = message_of(nested_mismatch());
    // The op is the first one observed: aten::linear on 2.x, its aten::addmm on 1.13.
    CHECK_MESSAGE(nested.rfind("step 1, forward (model and loss), in aten::", 0) == 0, nested);
    CHECK_MESSAGE(nested.find(" of module body.2: mat1 and mat2 shapes") != std::string::npos, nested);
    const auto own = message_of(own_check());
    CHECK_MESSAGE(own.rfind("step 1, forward (model and loss), between ops after module fc: ", 0) == 0, own);
    CHECK_MESSAGE(own.find("own_check wants 5 features, got 4") != std::string::npos, own);
  }

  TEST_CASE("anomaly mode stops the run at the first NaN and names its module") {
    setup s(4);
    {
      torch::NoGradGuard no_grad;
      s.model->layers[3]->as<torch::nn::Linear>()->weight.index_put_({0, 0}, std::nan(""));
    }
    auto settings = settings_for({}, 20);
    settings.options.diagnostics.anomaly = true;
    trainer_t t(settings);
    CHECK_THROWS_WITH_AS(t.fit(s.model, s.loader), doctest::Contains("layers.3"), kiln::anomaly_error);
  }

  TEST_CASE("diagnostics: masked attention (-inf before softmax) is not a NaN, gradient health is reported") {
    torch::manual_seed(0);
    kiln::models::gpt model(kiln::models::gpt_settings{.vocab_size = 16, .seq_len = 8, .d_model = 16, .n_layer = 1, .n_head = 2});
    kiln::data::batch_loader loader(kiln::data::make_token_sequences(64, 8, 16, 1), {.batch_size = 8});
    auto dir = fresh_dir("gradients");
    auto settings = settings_for(dir, 4);
    settings.options.diagnostics.every = 2;
    settings.options.diagnostics.anomaly = true;  // would throw on any NaN
    trainer_t t(settings);
    CHECK_NOTHROW(t.fit(model, loader));
    std::ifstream in(dir / "gradients.jsonl");
    int lines = 0, qkv = 0;
    for (std::string line; std::getline(in, line); ++lines) qkv += line.find("\"module\": \"blocks.0.attn.qkv\"") != std::string::npos;
    CHECK(qkv == 2);  // steps 2 and 4
    CHECK(lines > 2);
    fs::remove_all(dir);
  }
}
