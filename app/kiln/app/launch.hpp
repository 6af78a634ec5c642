// kiln/app/launch.hpp (the application): `kiln launch -n N RECIPE`, N local ranks of one job, as torchrun starts them.
//
// Each rank is this executable running `run RECIPE ...` with torchrun's environment (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT = a free port;
// rank 0 serves the TCPStore there). Their output is read through pipes and printed line by line
// with a "[rank r] " prefix. If a rank fails (a non-zero exit, a signal), the launcher says which
// and why, gives the others `grace` seconds to stop on their own (their collectives fail at once
// when a peer's connection closes, or after the sharding timeout when it hangs), then terminates
// them; it exits with the failed rank's status, so no job hangs and no failure reads as success.
#pragma once

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/errors.hpp"

extern char** environ;

namespace kiln::detail {

// A port nobody listens on now: bind port 0, read what the kernel chose, release it. (Another
// process could take it before rank 0 binds it; torchrun's standalone mode has the same window.)
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw error(std::string("kiln launch: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw error(std::string("kiln launch: finding a free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + ::strsignal(WTERMSIG(status));
  return "stopped";
}

struct launched_rank {
  pid_t pid = -1;
  int output = -1;       // read end of its stdout + stderr
  std::string partial;   // output after the last newline
  std::optional<int> status;
};

}  // namespace kiln::detail

namespace kiln {

struct launch_options {
  int ranks = 2;
  std::vector<std::string> rank_args;  // what each rank runs: {"run", RECIPE, "--set", ...}
  double grace_s = 30;                 // after a rank fails, how long the others may take to stop
};

// Runs the job; returns the exit status for the launcher: 0 when every rank succeeded, else the
// first failed rank's (128 + signal for a signal, as a shell reports it).
inline int launch(const std::string& executable, const launch_options& o) {
  using clock = std::chrono::steady_clock;
  if (o.ranks < 1) throw config_error("kiln launch: -n must be >= 1, got " + std::to_string(o.ranks));
  const int port = detail::free_port();
  std::vector<detail::launched_rank> ranks(static_cast<std::size_t>(o.ranks));

  for (int r = 0; r < o.ranks; ++r) {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) throw error(std::string("kiln launch: pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    for (const auto& earlier : ranks)
      if (earlier.output >= 0) posix_spawn_file_actions_addclose(&actions, earlier.output);

    std::vector<std::string> env_text;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      bool ours = false;
      for (const char* name : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="})
        ours = ours || entry.rfind(name, 0) == 0;
      if (!ours) env_text.push_back(entry);
    }
    for (const auto& [name, value] : {std::pair<std::string, std::string>{"RANK", std::to_string(r)},
                                      {"WORLD_SIZE", std::to_string(o.ranks)},
                                      {"LOCAL_RANK", std::to_string(r)},
                                      {"LOCAL_WORLD_SIZE", std::to_string(o.ranks)},
                                      {"MASTER_ADDR", "127.0.0.1"},
                                      {"MASTER_PORT", std::to_string(port)}})
      env_text.push_back(name + "=" + value);
    std::vector<char*> envp, argv;
    for (auto& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = {executable};
    args.insert(args.end(), o.rank_args.begin(), o.rank_args.end());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    auto& rank = ranks[static_cast<std::size_t>(r)];
    const int spawned = ::posix_spawn(&rank.pid, executable.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    if (spawned != 0) {
      ::close(pipe_fds[0]);
      for (auto& started : ranks)
        if (started.pid > 0) ::kill(started.pid, SIGKILL), ::waitpid(started.pid, nullptr, 0);
      throw error("kiln launch: starting rank " + std::to_string(r) + " (" + executable + "): " + std::strerror(spawned));
    }
    rank.output = pipe_fds[0];
  }
  std::fprintf(stderr, "kiln launch: %d ranks on 127.0.0.1:%d\n", o.ranks, port);

  auto print_lines = [](int r, detail::launched_rank& rank, bool flush) {
    std::size_t start = 0;
    for (std::size_t nl; (nl = rank.partial.find('\n', start)) != std::string::npos; start = nl + 1)
      std::printf("[rank %d] %.*s\n", r, static_cast<int>(nl - start), rank.partial.c_str() + start);
    rank.partial.erase(0, start);
    if (flush && !rank.partial.empty()) std::printf("[rank %d] %s\n", r, rank.partial.c_str()), rank.partial.clear();
    std::fflush(stdout);
  };

  int exit_code = 0;
  std::optional<clock::time_point> stop_by;  // set when a rank has failed
  bool terminated = false;
  while (true) {
    std::vector<pollfd> fds;
    for (auto& rank : ranks)
      if (rank.output >= 0) fds.push_back({rank.output, POLLIN, 0});
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    for (int r = 0; r < o.ranks; ++r) {
      auto& rank = ranks[static_cast<std::size_t>(r)];
      if (rank.output >= 0) {
        pollfd probe{rank.output, POLLIN, 0};
        if (::poll(&probe, 1, 0) > 0) {
          char buffer[4096];
          const auto n = ::read(rank.output, buffer, sizeof buffer);
          if (n > 0) {
            rank.partial.append(buffer, static_cast<std::size_t>(n));
            print_lines(r, rank, false);
          } else {
            print_lines(r, rank, true);
            ::close(rank.output);
            rank.output = -1;
          }
        }
      }
      int status = 0;
      if (!rank.status && ::waitpid(rank.pid, &status, WNOHANG) == rank.pid) {
        rank.status = status;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && exit_code == 0 && !terminated) {
          exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
          if (exit_code == 0) exit_code = 1;
          std::fprintf(stderr, "kiln launch: rank %d %s; stopping the job (the other ranks have %.0f s)\n", r,
                       detail::describe_status(status).c_str(), o.grace_s);
          stop_by = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(o.grace_s));
        }
      }
    }
    bool all_done = true;
    for (const auto& rank : ranks) all_done = all_done && rank.status && rank.output < 0;
    if (all_done) break;
    if (stop_by && !terminated && clock::now() > *stop_by) {
      terminated = true;
      for (int r = 0; r < o.ranks; ++r) {
        const auto& rank = ranks[static_cast<std::size_t>(r)];
        if (rank.status) continue;
        std::fprintf(stderr, "kiln launch: rank %d did not stop within %.0f s; killing it\n", r, o.grace_s);
        ::kill(rank.pid, SIGKILL);
      }
    }
  }
  return exit_code;
}

}  // namespace kiln
