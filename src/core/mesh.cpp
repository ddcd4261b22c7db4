#include "nax/core/mesh.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <set>

#include "nax/core/error.h"

namespace nax {

namespace {
bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
}  // namespace

Mesh::Mesh(std::vector<Axis> axes) : axes_(std::move(axes)) {
  if (axes_.empty()) fail("Mesh", "a mesh needs at least one axis");
  std::set<std::string> seen;
  size_ = 1;
  for (const auto& a : axes_) {
    if (!is_identifier(a.name)) fail("Mesh", "axis name '{}' is not an identifier", a.name);
    if (!seen.insert(a.name).second) fail("Mesh", "duplicate mesh axis '{}'", a.name);
    if (a.size < 1) fail("Mesh", "mesh axis '{}' has size {}; sizes must be at least 1", a.name, a.size);
    if (a.size > 4096 || size_ * a.size > 65536) fail("Mesh", "mesh too large at axis '{}={}'", a.name, a.size);
    size_ *= static_cast<int>(a.size);
  }
}

Mesh Mesh::parse(std::string_view spec) {
  std::vector<Axis> axes;
  std::string_view rest = spec;
  if (trim(spec).empty()) fail("Mesh::parse", "empty mesh spec; expected e.g. \"dp=2,mp=4\"");
  while (true) {
    auto comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    auto eq = item.find('=');
    if (eq == std::string_view::npos)
      fail("Mesh::parse", "'{}' in \"{}\" is not name=size (expected e.g. \"dp=2,mp=4\")", item, spec);
    std::string_view name = trim(item.substr(0, eq));
    std::string_view value = trim(item.substr(eq + 1));
    if (!is_identifier(name)) fail("Mesh::parse", "axis name '{}' in \"{}\" is not an identifier", name, spec);
    std::int64_t size = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), size);
    if (ec != std::errc() || ptr != value.data() + value.size())
      fail("Mesh::parse", "size '{}' of axis '{}' in \"{}\" is not an integer", value, name, spec);
    if (!is_identifier(name)) fail("Mesh::parse", "axis name '{}' in \"{}\" is not an identifier", name, spec);
    axes.push_back({std::string(name), size});
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  try {
    return Mesh(std::move(axes));
  } catch (const Error& e) {
    fail("Mesh::parse", "\"{}\": {}", spec, e.what());
  }
}

std::vector<std::string> Mesh::axis_names() const {
  std::vector<std::string> out;
  for (const auto& a : axes_) out.push_back(a.name);
  return out;
}

bool Mesh::has(const std::string& axis) const {
  for (const auto& a : axes_)
    if (a.name == axis) return true;
  return false;
}

int Mesh::axis_position(const std::string& axis) const {
  for (std::size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == axis) return static_cast<int>(i);
  fail("Mesh", "unknown mesh axis '{}' (mesh is {})", axis, str());
}

int Mesh::axis_size(const std::string& axis) const {
  return static_cast<int>(axes_[static_cast<std::size_t>(axis_position(axis))].size);
}

std::vector<int> Mesh::coords(int device) const {
  if (device < 0 || device >= size_) fail("Mesh", "device {} out of range for mesh {} ({} devices)", device, str(), size_);
  std::vector<int> c(axes_.size());
  for (std::size_t i = axes_.size(); i-- > 0;) {
    c[i] = device % static_cast<int>(axes_[i].size);
    device /= static_cast<int>(axes_[i].size);
  }
  return c;
}

int Mesh::coord(int device, const std::string& axis) const {
  return coords(device)[static_cast<std::size_t>(axis_position(axis))];
}

int Mesh::device_at(const std::vector<int>& coords) const {
  if (coords.size() != axes_.size()) fail("Mesh", "{} coordinates for a {}-axis mesh {}", coords.size(), axes_.size(), str());
  int device = 0;
  for (std::size_t i = 0; i < axes_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= axes_[i].size)
      fail("Mesh", "coordinate {} out of range for axis '{}' of size {}", coords[i], axes_[i].name, axes_[i].size);
    device = device * static_cast<int>(axes_[i].size) + coords[i];
  }
  return device;
}

void Mesh::check_axes(const std::vector<std::string>& axes, std::string_view op) const {
  if (axes.empty()) fail(op, "no mesh axes given (mesh is {})", str());
  std::set<std::string> seen;
  for (const auto& a : axes) {
    if (!has(a)) fail(op, "unknown mesh axis '{}' (mesh is {})", a, str());
    if (!seen.insert(a).second) fail(op, "mesh axis '{}' named twice", a);
  }
}

std::vector<int> Mesh::group(int device, const std::vector<std::string>& axes) const {
  check_axes(axes, "Mesh::group");
  std::vector<int> base = coords(device);
  std::vector<int> members;
  members.reserve(static_cast<std::size_t>(group_size(axes)));
  std::vector<int> index(axes.size(), 0);
  while (true) {
    std::vector<int> c = base;
    for (std::size_t i = 0; i < axes.size(); ++i) c[static_cast<std::size_t>(axis_position(axes[i]))] = index[i];
    members.push_back(device_at(c));
    std::size_t d = axes.size();
    while (d-- > 0) {
      if (++index[d] < axis_size(axes[d])) break;
      index[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) break;
  }
  return members;
}

int Mesh::rank_in_group(int device, const std::vector<std::string>& axes) const {
  check_axes(axes, "Mesh::rank_in_group");
  std::vector<int> c = coords(device);
  int rank = 0;
  for (const auto& a : axes) rank = rank * axis_size(a) + c[static_cast<std::size_t>(axis_position(a))];
  return rank;
}

int Mesh::group_size(const std::vector<std::string>& axes) const {
  int n = 1;
  for (const auto& a : axes) n *= axis_size(a);
  return n;
}

std::string Mesh::str() const {
  std::vector<std::string> parts;
  for (const auto& a : axes_) parts.push_back(fmt::format("{}={}", a.name, a.size));
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace nax
