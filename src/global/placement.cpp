#include "nax/global/placement.h"

#include <fmt/format.h>

#include <algorithm>

namespace nax {

std::string Placement::str() const {
  switch (kind_) {
    case Kind::replicate: return "R";
    case Kind::shard: return fmt::format("S({})", axis_);
    case Kind::partial: return fmt::format("P({})", reduce_op_name(op_));
  }
  return "?";
}

Placements::Placements(std::initializer_list<std::pair<std::string, Placement>> entries) {
  for (const auto& [mesh_axis, placement] : entries) set(mesh_axis, placement);
}

const Placement& Placements::on(const std::string& mesh_axis) const {
  static const Placement replicated = Placement::replicate();
  for (const auto& [m, p] : entries_)
    if (m == mesh_axis) return p;
  return replicated;
}

void Placements::set(const std::string& mesh_axis, Placement placement) {
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == mesh_axis; });
  if (placement.is_replicate()) {
    if (it != entries_.end()) entries_.erase(it);
  } else if (it != entries_.end()) {
    it->second = std::move(placement);
  } else {
    entries_.emplace_back(mesh_axis, std::move(placement));
  }
}

std::string Placements::str() const {
  std::vector<std::string> parts;
  for (const auto& [m, p] : entries_) parts.push_back(fmt::format("{}: {}", m, p.str()));
  return fmt::format("{{{}}}", fmt::join(parts, ", "));
}

bool Placements::operator==(const Placements& other) const {
  if (entries_.size() != other.entries_.size()) return false;
  for (const auto& [m, p] : entries_)
    if (!(other.on(m) == p)) return false;
  return true;
}

}  // namespace nax
