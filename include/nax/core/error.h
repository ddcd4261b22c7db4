#pragma once
// nax::Error: every misuse of the library throws this, with a message naming the op, the axes and
// the shapes involved.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace nax {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// fail("dot", "axis '{}' missing on the right: {}", name, shape) throws "dot: axis 'k' missing ...".
template <typename... Args>
[[noreturn]] void fail(std::string_view op, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format("{}: {}", op, fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace nax
