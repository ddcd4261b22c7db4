#pragma once
// A device mesh: named axes over devices, row-major. Mesh::parse("dp=2,mp=4") has 8 devices and
// device 5 sits at dp=1, mp=1.
#include <string>
#include <vector>

#include "nax/core/shape.h"

namespace nax {

class Mesh {
 public:
  Mesh() = default;
  explicit Mesh(std::vector<Axis> axes);
  static Mesh parse(std::string_view spec);

  int size() const { return size_; }  // number of devices
  const std::vector<Axis>& axes() const { return axes_; }
  std::vector<std::string> axis_names() const;
  bool has(const std::string& axis) const;
  int axis_size(const std::string& axis) const;  // throws for an unknown axis
  int axis_position(const std::string& axis) const;  // throws for an unknown axis

  std::vector<int> coords(int device) const;
  int coord(int device, const std::string& axis) const;
  int device_at(const std::vector<int>& coords) const;

  // The devices that share `device`'s coordinates on every axis not in `axes`, ordered row-major
  // over `axes` in the order given; and `device`'s position in that list.
  std::vector<int> group(int device, const std::vector<std::string>& axes) const;
  int rank_in_group(int device, const std::vector<std::string>& axes) const;
  int group_size(const std::vector<std::string>& axes) const;
  // Checks that `axes` are distinct mesh axes, naming `op` in the error.
  void check_axes(const std::vector<std::string>& axes, std::string_view op) const;

  std::string str() const;  // "dp=2,mp=4"
  bool operator==(const Mesh&) const = default;

 private:
  std::vector<Axis> axes_;
  int size_ = 1;
};

}  // namespace nax
