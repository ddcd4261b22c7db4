#include "nax/core/shape.h"

#include <fmt/format.h>


#include "nax/core/error.h"

namespace nax {

namespace {
// Quadratic on purpose: ranks are small and every op result is validated, so no allocation.
void validate(const std::vector<Axis>& axes) {
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const Axis& axis = axes[i];
    if (axis.name.empty()) fail("Shape", "an axis has an empty name");
    if (axis.size < 0) fail("Shape", "axis '{}' has negative size {}", axis.name, axis.size);
    bool duplicate = false;
    for (std::size_t j = 0; j < i; ++j) duplicate = duplicate || axes[j].name == axis.name;
    if (duplicate) {
      std::vector<std::string> parts;
      for (const auto& a : axes) parts.push_back(fmt::format("{}={}", a.name, a.size));
      fail("Shape", "duplicate axis '{}' in [{}]", axis.name, fmt::join(parts, ", "));
    }
  }
}
}  // namespace

Shape::Shape(std::initializer_list<Axis> axes) : axes_(axes) { validate(axes_); }
Shape::Shape(std::vector<Axis> axes) : axes_(std::move(axes)) { validate(axes_); }

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (const auto& a : axes_) n *= a.size;
  return n;
}

std::vector<std::string> Shape::names() const {
  std::vector<std::string> out;
  for (const auto& a : axes_) out.push_back(a.name);
  return out;
}

int Shape::index_of(const std::string& name) const {
  for (std::size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return static_cast<int>(i);
  return -1;
}

int Shape::require(const std::string& name, std::string_view op) const {
  int i = index_of(name);
  if (i < 0) fail(op, "unknown axis '{}' in {}", name, str());
  return i;
}

std::int64_t Shape::size(const std::string& name) const { return axes_[require(name, "Shape::size")].size; }

std::vector<std::int64_t> Shape::strides() const {
  std::vector<std::int64_t> s(axes_.size());
  std::int64_t stride = 1;
  for (std::size_t i = axes_.size(); i-- > 0;) {
    s[i] = stride;
    stride *= axes_[i].size;
  }
  return s;
}

std::string Shape::str() const {
  std::vector<std::string> parts;
  for (const auto& a : axes_) parts.push_back(fmt::format("{}={}", a.name, a.size));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

bool Shape::same_axes(const Shape& other) const {
  if (rank() != other.rank()) return false;
  for (const auto& axis : other.axes())
    if (!has(axis.name) || size(axis.name) != axis.size) return false;
  return true;
}

}  // namespace nax
