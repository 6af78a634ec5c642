// kiln/app/doctor.hpp (the application): what this machine gives a training run, and what holds it back.
//
// The biggest silent slowdowns on CPU are the BLAS library (the reference BLAS is ~50x slower
// than OpenBLAS) and the kernel OpenBLAS picked for the CPU, then the thread count. kiln does
// not change any of them behind the user's back: it reports them, with the fix, here.
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>
#include <torch/version.h>
#include <ATen/Version.h>

#include "kiln/precision/detail/cpu_bf16.hpp"
#include "kiln/threads.hpp"
#include "kiln/version.hpp"

namespace kiln {

struct doctor_line {
  std::string topic;
  std::string value;
  std::string warning;  // empty when all is well
};

namespace detail {

inline std::vector<std::string> loaded_libraries() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name && *info->dlpi_name)
          static_cast<std::vector<std::string>*>(data)->push_back(std::filesystem::weakly_canonical(info->dlpi_name));
        return 0;
      },
      &names);
  return names;
}

// What the LibTorch in this process was built with, from its own report (at::show_config(), which
// Python prints as torch.__config__.show()): "Build settings: KEY=value, ..." and a line per
// library ("Intel(R) MKL-DNN v3.12.0 ...").
struct libtorch_build {
  std::string library;   // the libtorch_cpu.so this process loaded
  std::string cuda;      // the CUDA version it was built for; empty: a CPU-only build
  std::string cudnn, blas, onednn;
  bool nccl = false, kineto = false;
};

inline libtorch_build describe_libtorch() {
  libtorch_build b;
  const std::string config = at::show_config();
  auto setting = [&](const std::string& key) -> std::string {
    const auto at = config.find(" " + key + "=");
    if (at == std::string::npos) return "";
    const auto first = at + key.size() + 2;
    return config.substr(first, config.find_first_of(",\n", first) - first);
  };
  if (setting("USE_CUDA") == "1" || setting("USE_CUDA") == "ON") b.cuda = setting("CUDA_VERSION");
  b.cudnn = setting("CUDNN_VERSION");
  b.blas = setting("BLAS_INFO");
  b.nccl = setting("USE_NCCL") == "1" || setting("USE_NCCL") == "ON";
  b.kineto = config.find(" -DUSE_KINETO") != std::string::npos;  // not EDGE_PROFILER_USE_KINETO
  if (const auto at = config.find("MKL-DNN v"); at != std::string::npos)
    b.onednn = config.substr(at + 8, config.find_first_of(" \n", at + 8) - (at + 8));
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::show_config), &info) && info.dli_fname) b.library = info.dli_fname;
  return b;
}

inline bool cpu_has_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

// Times an n^3 float GEMM with LibTorch, as the rate the model's matmuls can hope for.
inline double measured_gemm_gflops(std::int64_t n = 512) {
  auto a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::mm(a, b);
  const int reps = 8;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) torch::mm(a, b);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * n * n * n * reps / s / 1e9;
}

// A bf16 GEMM against fp32's on the same operands: LibTorch's own, and with kiln's fp32-computed
// matmuls (precision/detail/cpu_bf16.hpp). Times are the median of a few repetitions; errors are
// relative to the fp64 product of the bf16-rounded operands.
struct bf16_gemm_measurement {
  double libtorch_vs_fp32 = 0, libtorch_error = 0;  // LibTorch's bf16 GEMM
  double kiln_vs_fp32 = 0, kiln_error = 0;          // kiln's fp32-computed replacement
};

inline bf16_gemm_measurement measure_bf16_gemm(std::int64_t m = 256, std::int64_t k = 512, std::int64_t n = 512) {
  torch::manual_seed(0);
  const auto a = torch::randn({m, k}).to(torch::kBFloat16), b = torch::randn({k, n}).to(torch::kBFloat16);
  const auto a32 = a.to(torch::kFloat), b32 = b.to(torch::kFloat);
  const auto exact = torch::mm(a.to(torch::kDouble), b.to(torch::kDouble));
  auto error = [&](const torch::Tensor& p) { return ((p.to(torch::kDouble) - exact).norm() / exact.norm()).item<double>(); };
  auto median_ms = [](auto&& f) {
    f();
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      const auto start = std::chrono::steady_clock::now();
      f();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  bf16_gemm_measurement r;
  const double fp32_ms = median_ms([&] { torch::mm(a32, b32); });
  r.libtorch_vs_fp32 = median_ms([&] { torch::mm(a, b); }) / fp32_ms;
  r.libtorch_error = error(torch::mm(a, b));
  const auto replaced = precision::detail::fp32_cpu_matmuls::acquire();
  r.kiln_vs_fp32 = median_ms([&] { torch::mm(a, b); }) / fp32_ms;
  r.kiln_error = error(torch::mm(a, b));
  return r;
}

// What `kiln doctor` says of bf16 on this CPU, from the measurement and what the bf16 policies
// do here under cpu_matmul = "auto".
inline std::vector<doctor_line> bf16_gemm_lines(const bf16_gemm_measurement& m, bool onednn_bf16) {
  char text[320];
  std::snprintf(text, sizeof text, "LibTorch's %.1fx fp32's time, error %.1e; computed in fp32 %.1fx, error %.1e",
                m.libtorch_vs_fp32, m.libtorch_error, m.kiln_vs_fp32, m.kiln_error);
  std::vector<doctor_line> lines = {{"bf16 GEMM", text, ""}};
  if (!onednn_bf16)
    lines.push_back({"bf16 recipes", "matmuls computed in fp32 from bf16 operands, bf16 activations kept "
                                     "(precision.cpu_matmul = \"auto\"; \"bf16\" insists on LibTorch's)", ""});
  else if (m.libtorch_vs_fp32 > 1.5)
    lines.push_back({"bf16 recipes", "LibTorch's bf16 GEMM",
                     "it is slower than fp32 here: precision.cpu_matmul = \"fp32\" computes bf16 matmuls in fp32"});
  else
    lines.push_back({"bf16 recipes", "LibTorch's bf16 GEMM (oneDNN)", ""});
  return lines;
}

}  // namespace detail

inline std::vector<doctor_line> diagnose() {
  std::vector<doctor_line> lines;
  lines.push_back({"kiln", KILN_VERSION_STRING, ""});
  const auto build = detail::describe_libtorch();
  lines.push_back({"LibTorch", std::string(TORCH_VERSION) + (build.library.empty() ? "" : " (" + build.library + ")"), ""});
  lines.push_back({"LibTorch build",
                   (build.cuda.empty() ? std::string("CPU only") : "CUDA " + build.cuda) +
                       (build.cudnn.empty() ? "" : ", cuDNN " + build.cudnn) + (build.nccl ? ", NCCL" : "") +
                       (build.kineto ? ", Kineto" : ", no Kineto (the trace is kiln's own)") +
                       (build.onednn.empty() ? "" : ", oneDNN " + build.onednn) +
                       (build.blas.empty() ? "" : ", BLAS " + build.blas),
                   ""});

  const auto cores = std::thread::hardware_concurrency();
  const auto threads = at::get_num_threads();
  lines.push_back({"threads", std::to_string(threads) + " intra-op (of " + std::to_string(cores) + " cores)",
                   threads < static_cast<int>(cores)
                       ? "LibTorch defaults to fewer threads than cores here; recipes set [train] threads (0 = the free cores)"
                       : ""});

  const int busy = cores_busy_elsewhere();
  lines.push_back({"busy cores", std::to_string(busy) + " of " + std::to_string(cores) + " running other processes now",
                   busy > 0 ? "a step's threads stall on cores other processes hold (44x slower measured, "
                              "docs/threads.md): recipes with [train] threads = 0 use only the free cores, "
                              "for LibTorch and OpenBLAS, re-checked as the run goes; a fixed count does not adapt"
                            : ""});

  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  lines.push_back({"OpenMP wait", wait_policy ? std::string(wait_policy) : "unset (libgomp spins: active)",
                   !wait_policy && threads > 1
                       ? "with OpenBLAS threads beside OpenMP's, spinning threads slowed an MLP step 12x on 2 cores; "
                         "the kiln CLI sets OMP_WAIT_POLICY=PASSIVE; in your own programs call "
                         "kiln::ensure_passive_openmp_wait(argv) first in main(), or set it in the environment"
                       : ""});

  // Which BLAS library is loaded, and for OpenBLAS which kernel it chose.
  std::string blas = "unknown";
  for (const auto& lib : detail::loaded_libraries())
    if (lib.find("blas") != std::string::npos && lib.find("cublas") == std::string::npos) blas = lib;  // cuBLAS: the GPU's
  std::string blas_warning;
  if (blas == "unknown" && at::hasMKL()) {
    blas = "MKL, linked into LibTorch";  // PyTorch's own builds
  } else if (blas.find("openblas") == std::string::npos && blas.find("mkl") == std::string::npos &&
             blas.find("blis") == std::string::npos) {
    blas_warning = "this looks like the reference BLAS (~50x slower): apt-get install libopenblas0-pthread";
  }
  lines.push_back({"BLAS library", blas, blas_warning});

  using corename_fn = char* (*)();
  using threads_fn = int (*)();
  if (auto corename = reinterpret_cast<corename_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    const std::string core = corename();
    std::string warning;
    const bool avx512_cpu = detail::cpu_has_flag("avx512f");
    const bool avx512_core = core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
    if (avx512_cpu && !avx512_core)
      warning = "the CPU has AVX-512 but OpenBLAS chose its " + core +
                " kernel; OPENBLAS_CORETYPE=SkylakeX (or Cooperlake) selects the AVX-512 one: measure both";
    std::string value = core;
    if (auto nthreads = reinterpret_cast<threads_fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads")))
      value += ", " + std::to_string(nthreads()) + " OpenBLAS threads";
    using parallel_fn = int (*)();
    if (auto parallel = reinterpret_cast<parallel_fn>(dlsym(RTLD_DEFAULT, "openblas_get_parallel")))
      value += parallel() == 1 ? " (its own pthreads)" : parallel() == 2 ? " (OpenMP's)" : " (single-threaded build)";
    if (const char* env = std::getenv("OPENBLAS_CORETYPE")) value += std::string(" (OPENBLAS_CORETYPE=") + env + ")";
    lines.push_back({"OpenBLAS core", value, warning});
  }
  char gemm[64];
  std::snprintf(gemm, sizeof gemm, "%.1f GFLOP/s (512^3 fp32, %d threads)", detail::measured_gemm_gflops(), threads);
  lines.push_back({"GEMM rate", gemm, ""});
  const bool onednn_bf16 = precision::detail::cpu_has_onednn_bf16_gemm();
  lines.push_back({"CPU bf16", std::string(detail::cpu_has_flag("avx512_bf16") ? "AVX-512 BF16 dot products" : "no native bf16") +
                                   (onednn_bf16 ? "; LibTorch's bf16 GEMM is oneDNN's (fp32 sums)"
                                                : "; LibTorch's bf16 GEMM is a scalar loop summing in bf16"),
                   ""});
  for (auto& line : detail::bf16_gemm_lines(detail::measure_bf16_gemm(), onednn_bf16)) lines.push_back(std::move(line));

#ifdef KILN_GLOO
  lines.push_back({"Gloo", "available", ""});
#else
  lines.push_back({"Gloo", "not compiled in (kiln's CMake found no gloo/config.h; Debian: libgloo-dev)", ""});
#endif
#ifdef KILN_NCCL
  lines.push_back({"NCCL", "compiled in (used on GPUs by [sharding] backend = \"auto\" or \"nccl\")", ""});
#else
  lines.push_back({"NCCL", "not compiled in (needs a CUDA LibTorch and nccl.h)", ""});
#endif
  const bool cuda = torch::cuda::is_available();
  lines.push_back({"CUDA", cuda ? std::to_string(torch::cuda::device_count()) + " device(s)" : "not available", ""});

  const std::filesystem::path fmnist = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  lines.push_back({"Fashion-MNIST", std::filesystem::exists(fmnist) ? fmnist.parent_path().string() : "missing",
                   std::filesystem::exists(fmnist) ? "" : "apt-get install dataset-fashion-mnist"});
  return lines;
}

}  // namespace kiln
