// Profiler policies against known answers: operator counts of a known model, trace nesting,
// memory peaks of a known allocation pattern to the byte, the schedule, and the verdicts.
// kiln (and with it LibTorch) before doctest: glog's CHECK macros would replace doctest's.
#include <kiln/kiln.hpp>
#include <kiln/models.hpp>
#include <kiln/datasets.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <unistd.h>

#include "../cli_process.hpp"

namespace {

kiln::profiler::profiler_settings always_active() {
  return {.wait = 0, .warmup = 0, .active = 1000, .repeat = 1};
}

kiln::models::mlp three_linear_layers() {
  torch::manual_seed(0);
  return kiln::models::mlp(kiln::models::mlp_settings{.in_features = 8, .hidden = {16, 16}, .classes = 3});
}

}  // namespace

TEST_SUITE("profiler") {
  TEST_CASE("ops: three Linear layers give three addmm per forward and three AddmmBackward0 per backward") {
    auto model = three_linear_layers();
    auto x = torch::randn({4, 8});
    kiln::profiler::ops profiler(always_active());
    for (int i = 0; i < 5; ++i) {
      auto loss = model->forward(x).sum();
      loss.backward();
      profiler.on_step_end(i + 1);
    }
    auto& ops = profiler.collector<kiln::profiler::ops_collector>();
    CHECK(ops.calls("aten::addmm") == 15);
    CHECK(ops.calls("AddmmBackward0") == 15);
    CHECK(ops.recorded_steps() == 5);
    auto table = ops.table();
    REQUIRE_FALSE(table.empty());
    for (std::size_t i = 1; i < table.size(); ++i) CHECK(table[i - 1].self_us >= table[i].self_us);
    for (const auto& row : table) CHECK(row.self_us <= row.total_us + 1e-6);
  }

  TEST_CASE("ops: record_shapes splits statistics by input shapes, off mode installs nothing") {
    auto model = three_linear_layers();
    auto settings = always_active();
    settings.record_shapes = true;
    {
      kiln::profiler::ops profiler(settings);
      model->forward(torch::randn({4, 8}));
      model->forward(torch::randn({2, 8}));
      auto& ops = profiler.collector<kiln::profiler::ops_collector>();
      int addmm_rows = 0;
      for (const auto& row : ops.table())
        if (row.name == "aten::addmm") {
          ++addmm_rows;
          CHECK(row.shapes.find("[") != std::string::npos);
        }
      CHECK(addmm_rows == 6);  // 3 layers x 2 batch sizes
    }
    // wait = 5: nothing is recorded during the first five steps
    kiln::profiler::ops waiting({.wait = 5, .warmup = 0, .active = 1, .repeat = 1});
    model->forward(torch::randn({4, 8}));
    CHECK(waiting.collector<kiln::profiler::ops_collector>().calls("aten::addmm") == 0);
  }

  TEST_CASE("schedule: wait, warmup and active steps as torch.profiler counts them") {
    auto model = three_linear_layers();
    auto x = torch::randn({4, 8});
    // cycle of 1 wait + 1 warmup + 2 active, twice: steps 3, 4, 7, 8 are recorded
    kiln::profiler::ops profiler({.wait = 1, .warmup = 1, .active = 2, .repeat = 2});
    std::vector<int> modes;
    for (int step = 1; step <= 10; ++step) {
      modes.push_back(static_cast<int>(profiler.mode()));
      model->forward(x);
      profiler.on_step_end(step);
    }
    const int off = 0, warmup = 1, active = 2;  // profile_mode's values
    CHECK(modes == std::vector<int>{off, warmup, active, active, off, warmup, active, active, off, off});
    CHECK(profiler.collector<kiln::profiler::ops_collector>().calls("aten::addmm") == 4 * 3);
  }

  TEST_CASE("trace: phases nest inside steps and ops inside phases, the file is valid JSON") {
    auto model = three_linear_layers();
    auto x = torch::randn({4, 8});
    kiln::profiler::trace profiler(always_active());
    for (int step = 1; step <= 3; ++step) {
      profiler.begin(kiln::phase::forward);
      auto loss = model->forward(x).sum();
      profiler.end(kiln::phase::forward);
      profiler.begin(kiln::phase::backward);
      loss.backward();
      profiler.end(kiln::phase::backward);
      profiler.on_step_end(step);
    }
    const auto& trace = profiler.collector<kiln::profiler::trace_collector>();
    using event = kiln::profiler::trace_collector::event;
    std::vector<event> steps, phases, ops;
    for (const auto& e : trace.events())
      (e.category == "kiln" ? (e.name.rfind("step", 0) == 0 ? steps : phases) : ops).push_back(e);
    CHECK(steps.size() == 3);
    CHECK(phases.size() == 6);
    auto inside = [](const event& inner, const event& outer) {
      return inner.start_us >= outer.start_us && inner.start_us + inner.duration_us <= outer.start_us + outer.duration_us + 1e-3;
    };
    for (const auto& p : phases) {
      int parents = 0;
      for (const auto& s : steps) parents += inside(p, s);
      CHECK(parents == 1);
    }
    int addmm = 0;
    for (const auto& o : ops) {
      if (o.thread != phases.front().thread) continue;
      int parents = 0;
      for (const auto& p : phases) parents += inside(o, p);
      CHECK_MESSAGE(parents == 1, o.name);
      if (o.name == "aten::addmm") {
        ++addmm;
        bool in_forward = false;
        for (const auto& p : phases) in_forward = in_forward || (p.name == "forward" && inside(o, p));
        CHECK(in_forward);
      }
    }
    CHECK(addmm == 9);

    const auto file = std::filesystem::temp_directory_path() / ("kiln-trace-" + std::to_string(::getpid()) + ".json");
    std::ofstream(file) << trace.json();
    const auto check = "/usr/bin/python3 -c \"import json,sys; d=json.load(open(sys.argv[1])); "
                       "assert all(e['ph']=='X' and e['dur']>=0 for e in d['traceEvents'])\" " + file.string();
    CHECK(std::system(check.c_str()) == 0);
    std::filesystem::remove(file);
  }

  TEST_CASE("memory_meter counts a known allocation pattern to the byte") {
    kiln::memory_meter meter;
    meter.start();
    {
      auto a = torch::empty({1000}, torch::kFloat32);  // 4000 B
      auto b = torch::empty({2000}, torch::kFloat64);  // 16000 B
      CHECK(meter.current() == 20000);
      a = torch::Tensor();                            // -4000
      auto c = torch::empty({500}, torch::kInt16);    // +1000
      CHECK(meter.current() == 17000);
      CHECK(meter.peak() == 20000);
      meter.reset_peak();
      auto d = torch::empty({3000}, torch::kUInt8);   // +3000
      CHECK(meter.peak() == 20000);
    }
    CHECK(meter.current() == 0);
    meter.stop();
    auto e = torch::empty({100});
    CHECK(meter.current() == 0);  // stopped: not counted
  }

  TEST_CASE("a meter inside a meter counts into both, and a foreign holder of the profiler slot is refused") {
    kiln::memory_meter outer, inner;
    outer.start();
    auto a = torch::empty({1000}, torch::kFloat32);  // 4000 B, outer only
    inner.start();
    auto b = torch::empty({250}, torch::kFloat64);   // 2000 B, both
    CHECK(inner.current() == 2000);
    CHECK(outer.current() == 6000);
    inner.stop();
    b = torch::Tensor();                             // outer only again
    CHECK(inner.current() == 2000);
    CHECK(outer.current() == 4000);
    outer.stop();

    // Kineto keeps its state in the same slot; a stand-in for it.
    struct foreign_state : c10::DebugInfoBase {};
    c10::DebugInfoGuard kineto_like(c10::DebugInfoKind::PROFILER_STATE, std::make_shared<foreign_state>());
    kiln::memory_meter refused;
    CHECK_THROWS_WITH_AS(refused.start(), doctest::Contains("LibTorch's profiler (Kineto) is recording"),
                         std::logic_error);
    CHECK_FALSE(kiln::profiler::detail::kineto_session::slot_free());
  }

  TEST_CASE("the memory profiler holds LibTorch's profiler slot through its steps only, so trace skips Kineto then") {
    {
      kiln::profiler::profile<kiln::profiler::trace_collector, kiln::profiler::memory_collector> profiler(
          always_active());
      // The meter switches on before the trace, whatever the collectors' order: the trace finds
      // the slot taken and leaves Kineto out, where this LibTorch has Kineto.
      CHECK_FALSE(kiln::profiler::detail::kineto_session::slot_free());
      CHECK_FALSE(profiler.collector<kiln::profiler::trace_collector>().kineto_recording());
      profiler.begin(kiln::phase::forward);
      auto x = torch::ones({8}).sum();
      profiler.end(kiln::phase::forward);
      profiler.on_step_end(1);
      CHECK_FALSE(kiln::profiler::detail::kineto_session::slot_free());
      profiler.finish({});
      CHECK(kiln::profiler::detail::kineto_session::slot_free());
    }
    CHECK(kiln::profiler::detail::kineto_session::slot_free());
  }

  TEST_CASE("memory profiler: per-phase and per-step peaks, held bytes") {
    auto model = three_linear_layers();
    kiln::profiler::memory profiler(always_active());
    profiler.attach({&*model, 0, [] { return std::int64_t{123}; }});
    for (int step = 1; step <= 2; ++step) {
      profiler.begin(kiln::phase::forward);
      {
        auto a = torch::empty({4096}, torch::kFloat32);  // 16 KiB
        auto b = torch::empty({1024}, torch::kFloat32);  // 4 KiB
      }
      profiler.end(kiln::phase::forward);
      profiler.begin(kiln::phase::backward);
      auto kept = torch::empty({256}, torch::kFloat64);  // 2 KiB, freed after the step
      profiler.end(kiln::phase::backward);
      profiler.on_step_end(step);
    }
    const auto& memory = profiler.collector<kiln::profiler::memory_collector>();
    REQUIRE(memory.steps().size() == 2);
    for (const auto& s : memory.steps()) {
      CHECK(s.phase_peak_bytes[1] == 16384 + 4096);
      CHECK(s.phase_peak_bytes[2] == 2048);
      CHECK(s.peak_bytes == 20480);
    }
    auto held = memory.held_bytes();
    CHECK(held[0].second == (8 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3) * 4);
    CHECK(held[2].second == 123);
  }

  TEST_CASE("memory chart: the phase band under the curve shows each phase for as long as phases.csv says it ran") {
    // Phases of known, unequal lengths; forward allocates what backward frees, so memory climbs
    // in forward. The band must colour that climb "forward", and give each phase the share of the
    // step that the phases collector timed (the stretch before a step's first sample, its data
    // phase, is not sampled).
    kiln::profiler::profile<kiln::profiler::memory_collector, kiln::profiler::phases_collector> profiler(
        {.wait = 0, .warmup = 0, .active = 1000, .repeat = 1, .print = false});
    const std::vector<std::pair<kiln::phase, int>> plan = {
        {kiln::phase::data, 5}, {kiln::phase::forward, 40}, {kiln::phase::backward, 20}, {kiln::phase::optimizer, 10}};
    for (int step = 1; step <= 2; ++step) {
      torch::Tensor activations;
      for (const auto& [p, ms] : plan) {
        profiler.begin(p);
        if (p == kiln::phase::forward) activations = torch::ones({1 << 18});  // 1 MiB
        if (p == kiln::phase::backward) activations = torch::Tensor();
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        profiler.end(p);
      }
      profiler.on_step_end(step);
    }
    profiler.finish("");
    const auto& report = profiler.last_report();
    REQUIRE(report.phase_ms.size() == 2);
    const auto svg = kiln::profiler::html_detail::memory_chart(report);
    // The band's rectangles in order: (phase, width in px).
    std::vector<std::pair<std::string, double>> band;
    const auto group = svg.find("class=\"phase-band\"");
    REQUIRE(group != std::string::npos);
    for (auto at = svg.find("<rect x=", group); at != std::string::npos && at < svg.find("</g>", group);
         at = svg.find("<rect x=", at + 1)) {
      const auto w = svg.find("width=\"", at) + 7, t = svg.find("<title>", at) + 7;
      band.emplace_back(svg.substr(t, svg.find("</title>", t) - t), std::stod(svg.substr(w)));
    }
    const std::vector<std::string> expected = {"forward", "backward", "optimizer", "data",
                                               "forward", "backward", "optimizer"};
    std::vector<std::string> phases;
    for (const auto& b : band) phases.push_back(b.first);
    REQUIRE(phases == expected);
    // The second step, against what phases.csv holds for it: each of forward, backward and
    // optimizer has the band's share that it has of their sum in the phase timings.
    const auto& timed = report.phase_ms[1];
    const double timed_sum = timed[1] + timed[2] + timed[3], drawn_sum = band[4].second + band[5].second + band[6].second;
    for (int i = 1; i <= 3; ++i) {
      CAPTURE(phases[3 + i]);
      CHECK(band[3 + i].second / drawn_sum == doctest::Approx(timed[i] / timed_sum).epsilon(0.05));
    }
  }

  TEST_CASE("phases: a slow dataset gets the input-bound verdict, a fast one compute-bound") {
    using trainer_t = kiln::trainer<kiln::optim::adamw, kiln::profiler::phases>;
    auto run = [](double delay_ms) {
      torch::manual_seed(0);
      kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 64, .hidden = {256, 256}, .classes = 4});
      // Large batches of a small model: forward and backward dwarf the optimizer step.
      kiln::data::batch_loader loader(kiln::data::make_classification(4096, 64, 4, 1),
                                      {.batch_size = 1024, .delay_ms = delay_ms});
      trainer_t::settings s;
      s.options.steps = 12;
      s.options.progress = false;
      s.accelerator.profiler = {.wait = 1, .warmup = 1, .active = 10};
      trainer_t t(s);
      t.fit(model, loader);
      return t.accel().profiler().collector<kiln::profiler::phases_collector>().verdict();
    };
    CHECK(run(50.0).rfind("input-bound", 0) == 0);
    const auto fast = run(0.0);
    CHECK_MESSAGE(fast.rfind("compute-bound", 0) == 0, fast);
  }

  TEST_CASE("phases from a loop of one's own: the accelerator times backward and the optimizer, the loop the rest") {
    torch::manual_seed(0);
    kiln::models::mlp model(kiln::models::mlp_settings{.in_features = 32, .hidden = {64}, .classes = 4});
    kiln::accelerator<kiln::optim::adamw, kiln::profiler::phases> acc(
        {.accumulation = {.steps = 2}, .profiler = {.wait = 0, .warmup = 1, .active = 4}});
    acc.prepare(model);
    const auto data = kiln::data::make_classification(64, 32, 4, 1);
    for (std::int64_t micro = 0; micro < 10; ++micro) {  // 5 optimizer steps: 1 warmup, 4 recorded
      torch::Tensor x, y, loss;
      {
        auto timed = acc.phase(kiln::phase::data);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        x = data.inputs.slice(0, micro * 6, micro * 6 + 6), y = data.targets.slice(0, micro * 6, micro * 6 + 6);
      }
      {
        auto timed = acc.phase(kiln::phase::forward);
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      }
      acc.backward(loss);
      acc.step();
    }
    const auto& steps = acc.profiler().collector<kiln::profiler::phases_collector>().steps();
    REQUIRE(steps.size() == 4);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const auto& s = steps[i];
      CHECK(s.step == static_cast<std::int64_t>(i) + 2);
      CHECK(s.phase_ms[0] >= 2 * 5.0);  // data: two micro-batches of 5 ms each
      for (std::size_t p = 1; p < 4; ++p) CHECK(s.phase_ms[p] > 0);  // forward, backward, optimizer
      double phases = 0;
      for (double ms : s.phase_ms) phases += ms;
      CHECK(phases <= s.step_ms);
    }
  }

  TEST_CASE("kiln profile: any recipe, a report with every part and the files") {
    const auto dir = std::filesystem::temp_directory_path() / ("kiln-profile-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "slow.toml") << "[recipe]\nname = \"slow\"\n"
                                        "[model]\nkind = \"mlp\"\nin_features = 16\nhidden = [32]\nclasses = 4\n"
                                        "[data]\nkind = \"synthetic-classification\"\nfeatures = 16\nclasses = 4\n"
                                        "batch_size = 32\ndelay_ms = 15\n"
                                        "[optimizer]\nkind = \"adamw\"\n";
    const auto out =
        kiln::test::kiln_cli("profile " + (dir / "slow.toml").string() + " --set run.dir=" + (dir / "run").string())
            .output;
    CHECK_MESSAGE(out.find("verdict: input-bound") != std::string::npos, out);
    CHECK(out.find("top operators by self time") != std::string::npos);
    CHECK(out.find("peak of a step") != std::string::npos);
    for (const char* file : {"ops.csv", "ops.json", "trace.json", "memory.csv", "phases.csv", "report.html"})
      CHECK_MESSAGE(std::filesystem::exists(dir / "run" / "profile" / file), file);
    // Kineto's own trace where this LibTorch has Kineto (not Debian's 1.13), with kiln's phases
    // as user annotations; otherwise the report says why there is none.
    // kiln profile runs the memory profiler, which Kineto cannot share steps with: the report
    // says why there is no Kineto trace.
    CHECK(!std::filesystem::exists(dir / "run" / "profile" / "trace-kineto.json"));
    CHECK(out.find(kiln::profiler::detail::kineto_session::available() ? "Kineto not used"
                                                                        : "this LibTorch has no Kineto") != std::string::npos);
    std::filesystem::remove_all(dir);
  }

  TEST_CASE("a profile runs only the collectors its settings select, and refuses one it was not built with") {
    auto settings = always_active();
    settings.only = "trace+phases";
    auto model = three_linear_layers();
    {
      kiln::profiler::profile<kiln::profiler::ops_collector, kiln::profiler::trace_collector,
                              kiln::profiler::memory_collector, kiln::profiler::phases_collector>
          profiler(settings);
      // No memory meter: the slot is free, or Kineto holds it where this LibTorch has Kineto.
      const bool kineto = profiler.collector<kiln::profiler::trace_collector>().kineto_recording();
      CHECK(kineto == kiln::profiler::detail::kineto_session::available());
      CHECK(kiln::profiler::detail::kineto_session::slot_free() == !kineto);
      for (int step = 1; step <= 2; ++step) {
        profiler.begin(kiln::phase::forward);
        auto y = model->forward(torch::randn({4, 8}));
        profiler.end(kiln::phase::forward);
        profiler.on_step_end(step);
      }
      CHECK(profiler.collector<kiln::profiler::ops_collector>().recorded_steps() == 0);
      CHECK(profiler.collector<kiln::profiler::memory_collector>().steps().empty());
      CHECK(profiler.collector<kiln::profiler::phases_collector>().steps().size() == 2);
      CHECK_FALSE(profiler.collector<kiln::profiler::trace_collector>().events().empty());
    }
    settings.only = "ops+memry";
    CHECK_THROWS_WITH_AS(kiln::profiler::profile<kiln::profiler::ops_collector>{settings},
                         doctest::Contains("\"memry\" is not compiled into this profiler (ops)"), kiln::config_error);
  }

  TEST_CASE("a recipe may ask for fewer profilers than its binary has: the every-profiler build runs them") {
    const auto dir = std::filesystem::temp_directory_path() / ("kiln-subset-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "small.toml") << "[recipe]\nname = \"small\"\n"
                                         "[model]\nkind = \"mlp\"\nin_features = 16\nhidden = [32]\nclasses = 4\n"
                                         "[data]\nkind = \"synthetic-classification\"\nfeatures = 16\nclasses = 4\n"
                                         "batch_size = 32\n[train]\nsteps = 8\n[optimizer]\nkind = \"adamw\"\n"
                                         "[profiler]\nkind = [\"trace\", \"phases\"]\nwait = 1\nwarmup = 1\nactive = 3\n";
    const auto out = kiln::test::kiln_cli("run " + (dir / "small.toml").string() +
                                          " --no-progress --set run.dir=" + (dir / "run").string())
                         .output;
    CHECK_MESSAGE(out.find("=== kiln profile (trace+phases) ===") != std::string::npos, out);
    const auto profile = dir / "run" / "profile";
    for (const char* file : {"trace.json", "phases.csv", "report.html"}) CHECK_MESSAGE(std::filesystem::exists(profile / file), file);
    for (const char* file : {"ops.csv", "memory.csv"}) CHECK_MESSAGE(!std::filesystem::exists(profile / file), file);
    std::ifstream resolved(dir / "run" / "recipe.toml");
    const std::string text((std::istreambuf_iterator<char>(resolved)), std::istreambuf_iterator<char>());
    CHECK_MESSAGE(text.find("kind = [\"trace\", \"phases\"]") != std::string::npos, text);
    // With the memory profiler left out, Kineto records where this LibTorch has it (not
    // Debian's 1.13), with kiln's phases as user annotations.
    const auto kineto = profile / "trace-kineto.json";
    if (kiln::profiler::detail::kineto_session::available()) {
      REQUIRE(std::filesystem::exists(kineto));
      const auto check = "/usr/bin/python3 -c \"import json,sys; d=json.load(open(sys.argv[1])); "
                         "assert any(e.get('name')=='forward' for e in d['traceEvents'])\" " + kineto.string();
      CHECK(std::system(check.c_str()) == 0);
    } else {
      CHECK(!std::filesystem::exists(kineto));
      CHECK(out.find("this LibTorch has no Kineto") != std::string::npos);
    }
    std::filesystem::remove_all(dir);
  }
}
