#pragma once
// Named axes. A Shape is an ordered list of distinct axis names with sizes; memory order is the
// shape's order (row-major). Ops name axes, never positions.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace nax {

struct Axis {
  std::string name;
  std::int64_t size = 0;

  bool operator==(const Axis&) const = default;
};

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<Axis> axes);
  explicit Shape(std::vector<Axis> axes);

  int rank() const { return static_cast<int>(axes_.size()); }
  std::int64_t numel() const;
  const std::vector<Axis>& axes() const { return axes_; }
  const Axis& operator[](int i) const { return axes_[static_cast<std::size_t>(i)]; }
  std::vector<std::string> names() const;

  bool has(const std::string& name) const { return index_of(name) >= 0; }
  int index_of(const std::string& name) const;  // -1 when absent
  // Position of `name`, or a nax::Error naming `op` and this shape.
  int require(const std::string& name, std::string_view op) const;
  std::int64_t size(const std::string& name) const;  // throws when absent

  // Row-major strides in elements, one per axis.
  std::vector<std::int64_t> strides() const;

  std::string str() const;  // "[batch=4, seq=128]"
  bool operator==(const Shape&) const = default;
  // The same axes with the same sizes, in any order.
  bool same_axes(const Shape& other) const;

 private:
  std::vector<Axis> axes_;
};

}  // namespace nax
