#include "nax/core/vary.h"

#include <fmt/format.h>

#include <algorithm>

namespace nax {

Vary VaryType::kind(const std::string& mesh_axis) const {
  for (const auto& e : entries_)
    if (e.mesh_axis == mesh_axis) return e.kind;
  return Vary::Invariant;
}

const std::string& VaryType::split_axis(const std::string& mesh_axis) const {
  static const std::string none;
  for (const auto& e : entries_)
    if (e.mesh_axis == mesh_axis && e.kind == Vary::Split) return e.tensor_axis;
  return none;
}

std::vector<std::string> VaryType::split_mesh_axes(const std::string& tensor_axis) const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    if (e.kind == Vary::Split && e.tensor_axis == tensor_axis) out.push_back(e.mesh_axis);
  return out;
}

std::vector<std::string> VaryType::varying_mesh_axes() const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    if (e.kind == Vary::Varying) out.push_back(e.mesh_axis);
  return out;
}

bool VaryType::any_varying() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.kind == Vary::Varying; });
}

void VaryType::set_invariant(const std::string& mesh_axis) {
  std::erase_if(entries_, [&](const Entry& e) { return e.mesh_axis == mesh_axis; });
}

void VaryType::set_varying(const std::string& mesh_axis, VaryReason reason) {
  for (auto& e : entries_)
    if (e.mesh_axis == mesh_axis) {
      e.kind = Vary::Varying;
      e.tensor_axis.clear();
      e.reason = reason;
      return;
    }
  entries_.push_back({mesh_axis, Vary::Varying, {}, reason});
}

VaryReason VaryType::reason(const std::string& mesh_axis) const {
  for (const auto& e : entries_)
    if (e.mesh_axis == mesh_axis && e.kind == Vary::Varying) return e.reason;
  return VaryReason::per_device;
}

void VaryType::set_split(const std::string& mesh_axis, const std::string& tensor_axis) {
  set_invariant(mesh_axis);
  entries_.push_back({mesh_axis, Vary::Split, tensor_axis});
}

void VaryType::rename_tensor_axis(const std::string& from, const std::string& to) {
  for (auto& e : entries_)
    if (e.kind == Vary::Split && e.tensor_axis == from) e.tensor_axis = to;
}

std::string VaryType::str() const { return fmt::format("varying{{{}}}", fmt::join(varying_mesh_axes(), ",")); }

}  // namespace nax
