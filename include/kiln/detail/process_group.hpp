// kiln/detail/process_group.hpp: the process group kiln's distributed training talks through.
//
// A thin layer over c10d: a TCPStore for the rendezvous (rank 0 serves it) and a Gloo or NCCL
// process group for the collectives, set up from torchrun's environment. It adds what c10d
// leaves to its callers: a checked environment, one error type naming the rank and the
// collective that failed, a guard against Gloo's silent misuse cases, and a count of
// collectives (tests check bucketing with it).
//
// LibTorch 1.13 and 2.x need no version branch here. ProcessGroupGloo and ProcessGroupNCCL
// derive from c10d::ProcessGroup in 1.13 and from c10d::Backend in 2.x (where
// c10d::ProcessGroup became a wrapper dispatching to backends), but both versions declare
// these collectives, Options::create, Options::timeout and the constructors with the same
// signatures, and kiln holds the backend itself. Only code that must hand a c10d::ProcessGroup
// to c10d (the Reducer, say) would need the 2.x wrapper.
//
// NCCL: compiled where the build defines KILN_NCCL (kiln's CMake does for a CUDA LibTorch built
// with NCCL when it finds nccl.h; see cmake/kiln_dependencies.cmake). Its collectives take CUDA tensors
// only and are asynchronous on the GPU: wait() orders the current CUDA stream after them rather
// than blocking the CPU, which is all kiln's callers need (they read results through tensor
// ops or .item(), which synchronise). CPU tensors handed to the small collectives are staged
// through the rank's GPU (staging_device()). A collective that does not finish within the
// timeout is ended by c10d's NCCL watchdog, which by default aborts the process (kiln launch
// and torchrun then report that rank) rather than raising on the waiting thread; set
// TORCH_NCCL_BLOCKING_WAIT=1 to have the waiting rank fail with the collective's name instead,
// at the cost of the CPU blocking on every wait. The group is shut down when destroyed (aborted
// when an error is unwinding), as torch.distributed.destroy_process_group() does. This path has
// been checked against the 1.13 and 2.x headers but not yet run: no GPU machine has been
// available to kiln's sessions.
//
// Gloo likewise needs KILN_GLOO (defined where Gloo's headers are found: libgloo-dev on
// Debian). A build with neither backend still compiles; a distributed recipe then stops with
// an error saying why.
#pragma once

// LibTorch's headers declare each group only under its own macro as well.
#if defined(KILN_GLOO) && defined(USE_C10D_GLOO)
#define KILN_DETAIL_GLOO 1
#endif
#if defined(KILN_NCCL) && defined(USE_C10D_NCCL)
#define KILN_DETAIL_NCCL 1
#endif


#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#ifdef KILN_DETAIL_GLOO
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef KILN_DETAIL_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/cuda.h>
#include <torch/torch.h>

#include "kiln/errors.hpp"
#include "kiln/settings/fields.hpp"

namespace kiln {
// [sharding] backend: a c10d backend, or "auto" (NCCL where LibTorch has it and each rank a GPU, else Gloo).
enum class c10d_backend { automatic, gloo, nccl };
constexpr auto choices(c10d_backend) {
  return std::to_array<choice<c10d_backend>>(
      {{"auto", c10d_backend::automatic}, {"gloo", c10d_backend::gloo}, {"nccl", c10d_backend::nccl}});
}
}  // namespace kiln

namespace kiln::detail {

// Where this process sits in the job, as torchrun describes it.
struct dist_env {
  std::int64_t rank = 0;
  std::int64_t world = 1;
  std::int64_t local_rank = 0;   // rank among the processes on this host
  std::int64_t local_world = 1;  // processes on this host
  std::string master_addr;       // host of rank 0, which serves the TCPStore
  int master_port = 0;
};

namespace dist_env_detail {

inline std::string show(const char* name, std::string_view value) {
  return std::string(name) + "='" + std::string(value) + "'";
}

// The whole value must be a decimal integer in [lo, hi]: no sign games, spaces or suffixes.
inline std::int64_t parse_int(const char* name, std::string_view value, std::int64_t lo, std::int64_t hi) {
  std::int64_t out = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (value.empty() || ec != std::errc{} || end != value.data() + value.size() || out < lo || out > hi) {
    throw config_error(show(name, value) + ": expected an integer from " + std::to_string(lo) + " to " +
                       std::to_string(hi));
  }
  return out;
}

inline const char* require(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    throw config_error(std::string("RANK and WORLD_SIZE are set but ") + name +
                       " is not: a distributed launch sets all of RANK, WORLD_SIZE, LOCAL_RANK, "
                       "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun does");
  }
  return value;
}

}  // namespace dist_env_detail

// Reads torchrun's variables. Neither RANK nor WORLD_SIZE set: not a distributed launch
// (nullopt). Otherwise all six must be set and agree: a launcher that sets only some of them
// cannot be trusted to have started the rest of the job the way kiln assumes.
inline std::optional<dist_env> read_dist_env() {
  using namespace dist_env_detail;
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (rank == nullptr && world == nullptr) return std::nullopt;
  if (rank == nullptr) throw config_error(show("WORLD_SIZE", world) + " is set but RANK is not");
  if (world == nullptr) throw config_error(show("RANK", rank) + " is set but WORLD_SIZE is not");
  dist_env env;
  env.world = parse_int("WORLD_SIZE", world, 1, INT32_MAX);  // c10d takes ranks and sizes as int
  env.rank = parse_int("RANK", rank, 0, env.world - 1);
  env.local_world = parse_int("LOCAL_WORLD_SIZE", require("LOCAL_WORLD_SIZE"), 1, env.world);
  env.local_rank = parse_int("LOCAL_RANK", require("LOCAL_RANK"), 0, env.local_world - 1);
  env.master_addr = require("MASTER_ADDR");
  if (env.master_addr.empty()) throw config_error("MASTER_ADDR is set but empty");
  // Port 0 would have rank 0 bind a port of its choosing, which the other ranks cannot know.
  env.master_port = static_cast<int>(parse_int("MASTER_PORT", require("MASTER_PORT"), 1, 65535));
  return env;
}

// The c10d backend a group's collectives run on.
enum class backend { gloo, nccl };

// Whether this build can make a group of each kind at all.
inline constexpr bool gloo_built =
#ifdef KILN_DETAIL_GLOO
    true;
#else
    false;
#endif
inline constexpr bool nccl_built =
#ifdef KILN_DETAIL_NCCL
    true;
#else
    false;
#endif

// "auto" (NCCL where this build has it and there is a GPU for each rank on this host, else Gloo,
// as torch.distributed users choose), "gloo" or "nccl"; `where` names the setting in errors.
// NCCL needs a GPU of its own per rank: two ranks on one GPU fail at their first collective.
inline backend resolve_backend(c10d_backend setting, const std::string& where, std::int64_t local_ranks = 1) {
  const std::string name = choice_name(setting);
  const auto gpus = [] { return torch::cuda::is_available() ? static_cast<std::int64_t>(torch::cuda::device_count()) : 0; };
  const auto gloo = [&] {
    if (!gloo_built)
      throw config_error(where + " = \"" + std::string(name) + "\": this build has no Gloo (kiln's CMake found no "
                         "gloo/config.h: install libgloo-dev)" +
                         (nccl_built ? "; NCCL is there, for GPUs" : ", and no NCCL either"));
    return backend::gloo;
  };
  if (setting == c10d_backend::gloo) return gloo();
  if (setting == c10d_backend::nccl) {
    if (!nccl_built)
      throw config_error(where + " = \"nccl\": this build of LibTorch has no NCCL (a CPU-only LibTorch such as "
                         "Debian's, or kiln's CMake found no nccl.h); use \"gloo\" or \"auto\"");
    if (gpus() == 0)
      throw config_error(where + " = \"nccl\": NCCL runs on GPUs and this process sees none; use \"gloo\" or \"auto\"");
    if (gpus() < local_ranks)
      throw config_error(where + " = \"nccl\": " + std::to_string(local_ranks) + " ranks on this host and " +
                         std::to_string(gpus()) + " GPU" + (gpus() == 1 ? "" : "s") +
                         " visible; NCCL needs one GPU per rank: start at most that many ranks per host, or use \"gloo\"");
    return backend::nccl;
  }
  return nccl_built && gpus() >= local_ranks ? backend::nccl : gloo();
}

// Whether this LibTorch's Gloo sums bfloat16 tensors: PyTorch 2.2 added it, 1.13's fails the
// collective with "Invalid scalar type" (its Gloo has float16 only). Found by trying rather than
// by version, once per process, in a one-rank group of the process's own (an in-memory store,
// no peers): every rank of a job runs the same LibTorch, so all reach the same answer.
inline bool try_gloo_bfloat16_sum() {
#ifdef KILN_DETAIL_GLOO
  try {
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    c10d::ProcessGroupGloo group(c10::make_intrusive<c10d::HashStore>(), 0, 1, options);
    std::vector<at::Tensor> one{torch::full({1}, 1.5, torch::kBFloat16)};
    group.allreduce(one)->wait();
    return one[0].item<float>() == 1.5f;
  } catch (const std::exception&) {
    return false;
  }
#else
  return false;
#endif
}
inline bool gloo_sums_bfloat16() {
  static const bool sums = try_gloo_bfloat16_sum();
  return sums;
}

// A collective in flight. Gloo runs it on its own threads; failures show only when it is waited
// on, so this is where they become distributed_error. The collective holds its tensors, and
// dropping this object does not cancel it.
class [[nodiscard]] pending_collective {
 public:
  pending_collective(c10::intrusive_ptr<c10d::Work> work, std::string description)
      : work_(std::move(work)), description_(std::move(description)) {}

  // Blocks until the collective is done on this rank: its output tensors are then final.
  void wait() {
    try {
      work_->wait();
    } catch (const c10::Error& e) {
      throw distributed_error(description_ + " failed: " + e.what_without_backtrace());
    } catch (const std::exception& e) {  // Gloo's own, e.g. gloo::IoException for a closed peer
      throw distributed_error(description_ + " failed: " + e.what());
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string description_;
};

// This process's membership in a Gloo group over TCP. Every rank must launch the same
// collectives in the same order: Gloo matches them up by their sequence. Launching from
// another thread (an autograd hook) is fine; two threads racing to launch is not, as their
// order would differ between ranks.
//
// Destroying a Gloo group waits for the collectives still in flight, so unwinding past one whose
// peer hangs takes up to the timeout.
class process_group {
 public:
  enum class collective { allreduce, broadcast, allgather, barrier };

  // c10d's default, which torch.distributed uses for Gloo.
  static constexpr std::chrono::milliseconds default_timeout = std::chrono::minutes(30);

  // Blocks until every rank has joined. The store is needed only for that, and the group keeps it
  // (on rank 0, the server) until it is destroyed. `timeout` bounds the rendezvous: rank 0
  // reports a rank that never came after the timeout (LibTorch 2.x's TCPStore) or about twice
  // it (1.13's gives up silently and Gloo's own wait expires after it). It bounds each
  // collective too: under Gloo a peer that stops answering fails the collective after it, one
  // that exits fails it at once.
  //
  // NCCL: the rank's GPU is cuda:(LOCAL_RANK mod the GPUs visible), as kiln's [train] device
  // "cuda" picks it, until use_device() names the model's.
  explicit process_group(const dist_env& env, std::chrono::milliseconds timeout = default_timeout,
                         backend kind = backend::gloo)
      : rank_(env.rank), world_(env.world), timeout_(timeout), backend_(kind) {
    try {
      auto store = make_store(env.master_addr, c10d::TCPStoreOptions{.port = static_cast<std::uint16_t>(env.master_port),
                                                                     .isServer = env.rank == 0,
                                                                     .numWorkers = static_cast<std::size_t>(env.world),
                                                                     .waitWorkers = true,
                                                                     .timeout = timeout});
      if (kind == backend::nccl) {
#ifdef KILN_DETAIL_NCCL
        use_device(torch::Device(torch::kCUDA,
                                 static_cast<c10::DeviceIndex>(env.local_rank % torch::cuda::device_count())));
        auto options = c10d::ProcessGroupNCCL::Options::create();
        options->timeout = timeout;
        nccl_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(env.rank),
                                                            static_cast<int>(env.world), options);
#else
        throw config_error("an NCCL process group in a build without NCCL");  // resolve_backend() refuses first
#endif
      } else {
#ifdef KILN_DETAIL_GLOO
        auto options = c10d::ProcessGroupGloo::Options::create(timeout);
        options->devices.push_back(gloo_device(env.master_addr));
        gloo_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(env.rank),
                                                            static_cast<int>(env.world), options);
#else
        throw config_error("a Gloo process group in a build without Gloo");  // resolve_backend() refuses first
#endif
      }
    } catch (const config_error&) {
      throw;
    } catch (const c10::Error& e) {
      throw distributed_error(joining(env) + e.what_without_backtrace());
    } catch (const std::exception& e) {  // c10d::TimeoutError, gloo::IoException, ...
      throw distributed_error(joining(env) + e.what());
    }
  }

  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;
  ~process_group() {
#ifdef KILN_DETAIL_NCCL
    if (nccl_) close(*nccl_, /*failed=*/std::uncaught_exceptions() > 0);
#endif
  }

  // NCCL: the GPU this rank's collectives and staged tensors use, the model's (before the first
  // collective: c10d makes the rank's NCCL communicator on first use, for that tensor's GPU).
  // It also becomes this thread's current CUDA device. Gloo: nothing to do.
  void use_device(const torch::Device& device) {
#ifdef KILN_DETAIL_NCCL
    if (backend_ != backend::nccl) return;
    staging_device_ = device;
    c10::cuda::set_device(device.index());
#else
    (void)device;
#endif
  }

  std::int64_t rank() const { return rank_; }
  std::int64_t world() const { return world_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  backend kind() const { return backend_; }
  // Where tensors must be for this group's collectives: the CPU for Gloo (which also takes CUDA
  // tensors in CUDA builds), the rank's GPU for NCCL.
  const torch::Device& staging_device() const { return staging_device_; }

  // The dtype this group's collectives carry `dtype` values in: their own wherever the backend
  // sums it, else float32. Only bfloat16 on a Gloo without it (LibTorch before 2.2) is widened:
  // twice the bytes, exact for broadcasts, and sums rounded once, to bf16 at the end, instead of
  // after every addition. NCCL sums every floating type kiln trains in.
  c10::ScalarType wire_dtype(c10::ScalarType dtype) const {
    if (backend_ == backend::gloo && dtype == c10::kBFloat16 && !gloo_sums_bfloat16()) return c10::kFloat;
    return dtype;
  }

  // Collectives of one kind this rank has launched, counting those c10d rejected at launch.
  std::int64_t launched(collective c) const { return launched_[static_cast<std::size_t>(c)].load(); }

  // Each collective takes single tensors. In c10d a tensor list means "this rank's copies of one
  // tensor on several devices": Gloo sums the entries of an all-reduce list into each other and
  // broadcasts the root's first entry into all of them. To reduce many tensors in one collective,
  // flatten them into one (a DDP bucket). Tensors must be contiguous, views such as narrow() of
  // a flat bucket included: Gloo ignores strides and would read and write the wrong elements.

  // Sums `tensor` over all ranks, in place. Gloo has no average: divide afterwards.
  pending_collective allreduce_sum(const at::Tensor& tensor) {
    std::vector<at::Tensor> tensors{tensor};
    return launch(collective::allreduce, tensors,
                  [&] { return on_backend([&](auto& pg) { return pg.allreduce(tensors); }); });
  }

  // Overwrites `tensor` with rank `root`'s.
  pending_collective broadcast(const at::Tensor& tensor, std::int64_t root) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    return launch(collective::broadcast, tensors,
                  [&] { return on_backend([&](auto& pg) { return pg.broadcast(tensors, options); }); });
  }

  // outputs[r] receives rank r's `input`; outputs holds world() tensors shaped like it. Gloo in
  // 1.13 has no single-tensor all-gather (_allgather_base): to gather into one flat tensor, pass
  // its chunk(world()) as outputs.
  pending_collective allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) {
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> output_lists{outputs};
    std::vector<at::Tensor> operands{input};
    operands.insert(operands.end(), outputs.begin(), outputs.end());
    return launch(collective::allgather, operands,
                  [&] { return on_backend([&](auto& pg) { return pg.allgather(output_lists, inputs); }); });
  }

  // Returns when every rank has reached its barrier.
  void barrier() {
    c10d::BarrierOptions options;  // NCCL would otherwise guess the GPU from the rank, with a warning
    if (staging_device_.is_cuda()) options.device_ids = {staging_device_.index()};
    launch(collective::barrier, {}, [&] { return on_backend([&](auto& pg) { return pg.barrier(options); }); }).wait();
  }

 private:
  // LibTorch 2.4+ asks TCPStore for its libuv server by default and refuses the request, on
  // every rank and before connecting, where the build has no libuv (Debian 13's 2.6). Like
  // torch.distributed, follow USE_LIBUV (default 1); unlike it, fall back to the classic server
  // when this LibTorch has no libuv rather than fail the job. 1.13 has only the classic server.
  template <class Options>
  static c10::intrusive_ptr<c10d::TCPStore> make_store(const std::string& host, Options options) {
    if constexpr (requires { options.useLibUV; }) {
      const char* use_libuv = std::getenv("USE_LIBUV");
      options.useLibUV = use_libuv == nullptr || std::string_view(use_libuv) != "0";
      if (options.useLibUV) {
        try {
          return c10::make_intrusive<c10d::TCPStore>(host, options);
        } catch (const std::exception& e) {
          if (std::string_view(e.what()).find("without libuv") == std::string_view::npos) throw;
          options.useLibUV = false;
        }
      }
    }
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  }

#ifdef KILN_DETAIL_GLOO
  // Gloo binds the device's address and publishes it to the peers through the store.
  // GLOO_SOCKET_IFNAME picks the interface, as in torch.distributed. A loopback master means
  // that every rank runs on this host, so loopback serves and needs no name resolution;
  // otherwise bind the address this host's name resolves to, as torch.distributed does.
  static std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
    if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface != nullptr && *interface != '\0') {
      return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
    }
    if (master_addr == "localhost" || master_addr == "::1" || master_addr.starts_with("127.")) {
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    }
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }
#endif

  // LibTorch 2.x warns when an NCCL group is destroyed without shutdown() and then aborts it;
  // 1.13's has neither call and cleans up in its destructor.
  template <class Group>
  static void close(Group& group, bool failed) noexcept {
    try {
      if (failed) {
        if constexpr (requires { group.abort(); }) group.abort();
      } else if constexpr (requires { group.shutdown(); }) {
        group.shutdown();
      }
    } catch (const std::exception&) {  // leaving anyway
    }
  }

  // Runs `start` on the backend this group holds.
  template <class Start>
  c10::intrusive_ptr<c10d::Work> on_backend(Start&& start) {
#ifdef KILN_DETAIL_NCCL
    if (nccl_) return start(*nccl_);
#endif
#ifdef KILN_DETAIL_GLOO
    return start(*gloo_);
#else
    throw distributed_error("no process group");  // unreachable: the constructor made one or threw
#endif
  }

  std::string joining(const dist_env& env) const {
    return "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": joining the " +
           (backend_ == backend::nccl ? "NCCL" : "Gloo") + " process group at " +
           env.master_addr + ":" + std::to_string(env.master_port) + " (timeout " +
           std::to_string(timeout_.count()) + " ms) failed: ";
  }

  // E.g. "rank 1 of 4: allreduce #12 of 26214400 bytes (timeout 1800000 ms)".
  std::string describe(collective c, std::int64_t number, const std::vector<at::Tensor>& operands) const {
    static constexpr std::array<const char*, 4> names{"allreduce", "broadcast", "allgather", "barrier"};
    std::string s = "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " +
                    names[static_cast<std::size_t>(c)] + " #" + std::to_string(number);
    if (!operands.empty()) s += " of " + std::to_string(operands[0].nbytes()) + " bytes";
    return s + " (timeout " + std::to_string(timeout_.count()) + " ms)";
  }

  // operands: every tensor the collective reads or writes, the one that sizes it first.
  template <class Start>
  pending_collective launch(collective c, const std::vector<at::Tensor>& operands, Start&& start) {
    const std::int64_t number = launched_[static_cast<std::size_t>(c)].fetch_add(1) + 1;
    std::string description = describe(c, number, operands);
    for (const auto& t : operands) {
      if (t.defined() && !t.is_contiguous()) {
        throw distributed_error(description + " needs contiguous tensors (Gloo ignores strides)");
      }
    }
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = start();
    } catch (const c10::Error& e) {  // c10d's argument checks
      throw distributed_error(description + " failed to launch: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw distributed_error(description + " failed to launch: " + e.what());
    }
    return pending_collective(std::move(work), std::move(description));
  }

  std::int64_t rank_;
  std::int64_t world_;
  std::chrono::milliseconds timeout_;
  backend backend_;
  torch::Device staging_device_{torch::kCPU};
#ifdef KILN_DETAIL_GLOO
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_;
#endif
#ifdef KILN_DETAIL_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_;
#endif
  std::array<std::atomic<std::int64_t>, 4> launched_{};
};

}  // namespace kiln::detail
