// kiln/detail/glob.hpp: name patterns over dotted module and parameter names, as recipes
// write them ([checkpointing] modules, [optimizer] no_decay).
#pragma once

namespace kiln::detail {

// Glob over dotted module names: '*' matches within one name segment, '**' across segments.
inline bool glob_match(const char* pattern, const char* name) {
  if (*pattern == '\0') return *name == '\0';
  if (pattern[0] == '*' && pattern[1] == '*') {
    for (const char* n = name;; ++n) {
      if (glob_match(pattern + 2, n)) return true;
      if (*n == '\0') return false;
    }
  }
  if (*pattern == '*') {
    for (const char* n = name;; ++n) {
      if (glob_match(pattern + 1, n)) return true;
      if (*n == '\0' || *n == '.') return false;
    }
  }
  return *pattern == *name && glob_match(pattern + 1, name + 1);
}

}  // namespace kiln::detail
