// bench/bench_common.hpp: what kiln's C++ benchmarks share: the median of their paired rounds
// and their "--name value" command lines.
#pragma once

#include <kiln/threads.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace kiln_bench {

// The median of per-round figures (of an even count, the mean of the middle two, as Python's
// statistics.median on the benchmarks' Python sides).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// A benchmark's command line of "--name value" pairs. A flag the benchmark does not take, a flag
// without a value, or a number that is not one stops it with a message naming the flag: a typo
// would otherwise run the defaults and print a table that looks right.
class flags {
 public:
  flags(int argc, char** argv, const std::vector<std::string>& known) : program_(argv[0]) {
    // As the kiln CLI runs (threads.hpp): a bench binary started by hand measures the same.
    kiln::ensure_passive_openmp_wait(argv);
    for (int i = 1; i < argc; i += 2) {
      const std::string name = argv[i];
      if (std::find(known.begin(), known.end(), name) == known.end()) fail("unknown option " + name);
      if (i + 1 >= argc) fail(name + " needs a value");
      values_[name] = argv[i + 1];
    }
  }

  std::int64_t integer(const std::string& name, std::int64_t fallback) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::size_t used = 0;
    std::int64_t value = 0;
    try {
      value = std::stoll(it->second, &used);
    } catch (const std::exception&) {
    }
    if (used == 0 || used != it->second.size()) fail(name + " takes an integer, got '" + it->second + "'");
    return value;
  }

  std::string text(const std::string& name, std::string fallback) const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), why.c_str());
    std::exit(2);
  }

  std::string program_;
  std::map<std::string, std::string> values_;
};

}  // namespace kiln_bench
