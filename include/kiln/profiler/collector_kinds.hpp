// kiln/profiler/collector_kinds.hpp: a profiler kind names one collector or several ("ops+memory").
// Free of LibTorch, so that the recipe tables (and the catalog generator) can use it too.
#pragma once

#include <string_view>

namespace kiln {

// "ops+memory" -> each of "ops", "memory".
template <class F>
void for_each_collector_kind(std::string_view kind, F&& f) {
  while (!kind.empty()) {
    const auto plus = kind.find('+');
    f(kind.substr(0, plus));
    kind = plus == std::string_view::npos ? std::string_view{} : kind.substr(plus + 1);
  }
}

}  // namespace kiln
