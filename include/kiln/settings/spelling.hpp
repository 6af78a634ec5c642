// kiln/settings/spelling.hpp: what an error message says about a name that was mistyped: the
// names it could have been, quoted, and the closest of them.
// This header does not depend on LibTorch or toml++.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::detail {

// Edits (insert, delete, replace, swap two neighbours) that turn `a` into `b`: the optimal
// string alignment distance. Swaps count once because "fp61" for "fp16" is one slip of the
// fingers, not two, and must be closer to "fp16" than to "fp32".
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// " (did you mean "lr"?)" when a known name is close to the unknown one.
inline std::string did_you_mean(std::string_view unknown, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_distance = 3;  // farther than 2 edits is not a typo
  for (const auto& k : known) {
    auto d = edit_distance(unknown, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  return best.empty() ? std::string{} : " (did you mean \"" + best + "\"?)";
}

// `"a", "b"` for error messages.
inline std::string quoted_list(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "\"" : ", \"") + name + "\"";
  return text;
}

}  // namespace kiln::detail
