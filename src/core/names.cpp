#include "nax/core/names.h"

#include <fmt/format.h>

namespace nax {

std::string Names::str() const {
  if (names_.size() == 1) return names_[0];
  return fmt::format("({})", fmt::join(names_, ", "));
}

}  // namespace nax
