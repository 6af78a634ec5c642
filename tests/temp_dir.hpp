// tests/temp_dir.hpp: a fresh directory per test case, removed at its end.
#pragma once

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <unistd.h>

namespace kiln::test {

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& name) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("kiln_test_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  // Writes `text` to <dir>/<name> and returns the path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    auto file = path / name;
    std::ofstream(file) << text;
    return file;
  }
};

}  // namespace kiln::test
