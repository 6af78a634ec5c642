// tests/text_checks.hpp: what the tests ask of a message or an output.
#pragma once

#include <string>

namespace kiln::test {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace kiln::test
