// kiln/io/state.hpp: named tensors on disk, written so that a crash never loses the last
// good state.
//
// kiln saves everything (model, optimizer state, scheduler, data position, RNG) as one flat
// map from a readable name ("model/layers.0.weight", "optim/layers.0.weight/exp_avg") to a
// tensor. Storing by name, not by LibTorch's optimizer archive, keeps checkpoints loadable
// across LibTorch versions and across sharding layouts. Files are written to a temporary
// name, flushed to disk, then renamed over the old one: a crash mid-write leaves the previous
// file intact.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <torch/torch.h>

#include "kiln/errors.hpp"

namespace kiln {

using state_dict = std::map<std::string, torch::Tensor>;

// Scalars travel as 0-d tensors; these keep call sites short and exact (int64, float64).
inline torch::Tensor scalar_tensor(std::int64_t v) { return torch::tensor(v, torch::kInt64); }
inline torch::Tensor scalar_tensor(double v) { return torch::tensor(v, torch::kFloat64); }

inline const torch::Tensor& require(const state_dict& state, const std::string& key) {
  auto it = state.find(key);
  if (it == state.end()) throw state_error("saved state has no entry \"" + key + "\"");
  return it->second;
}

namespace detail {
inline void fsync_path(const std::filesystem::path& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}
}  // namespace detail

// Writes `state` to `path` atomically (temp file + fsync + rename + fsync of the directory).
inline void save_state_file(const std::filesystem::path& path, const state_dict& state) {
  torch::serialize::OutputArchive archive;
  for (const auto& [key, tensor] : state) archive.write(key, tensor.detach().cpu());
  auto tmp = path;
  tmp += ".tmp";
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (!file) throw state_error("cannot open " + tmp.string() + " for writing");
  bool ok = true;
  archive.save_to([&](const void* data, size_t size) -> size_t {
    if (std::fwrite(data, 1, size, file) != size) ok = false;
    return size;
  });
  ok = ok && std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0;
  ok = (std::fclose(file) == 0) && ok;
  if (!ok) {
    std::filesystem::remove(tmp);
    throw state_error("writing " + tmp.string() + " failed (disk full?); the previous state is untouched");
  }
  std::filesystem::rename(tmp, path);
  detail::fsync_path(path.parent_path().empty() ? "." : path.parent_path(), O_RDONLY | O_DIRECTORY);
}

inline state_dict load_state_file(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw state_error("no saved state at " + path.string());
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path.string());
  } catch (const c10::Error& e) {
    throw state_error("cannot read saved state " + path.string() + ": " + e.what_without_backtrace());
  }
  state_dict state;
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    archive.read(key, t);
    state.emplace(key, t);
  }
  return state;
}

// Copies a module's parameters and buffers into `state` under "prefix/name".
inline void save_module(const torch::nn::Module& module, state_dict& state, const std::string& prefix) {
  for (const auto& item : module.named_parameters()) state[prefix + item.key()] = item.value().detach().clone();
  for (const auto& item : module.named_buffers()) state[prefix + item.key()] = item.value().detach().clone();
}

// Loads what save_module wrote; every parameter and buffer must be present with its shape.
inline void load_module(torch::nn::Module& module, const state_dict& state, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, torch::Tensor& target) {
    const auto& saved = require(state, prefix + name);
    if (saved.sizes() != target.sizes())
      throw state_error("saved \"" + prefix + name + "\" has shape " + c10::str(saved.sizes()) +
                        " but the model's has " + c10::str(target.sizes()));
    target.copy_(saved);
  };
  for (auto& item : module.named_parameters()) load(item.key(), item.value());
  for (auto& item : module.named_buffers()) load(item.key(), item.value());
}

}  // namespace kiln
