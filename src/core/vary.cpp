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

PartialKind VaryType::partial(const std::string& mesh_axis) const {
  for (const auto& e : entries_)
    if (e.mesh_axis == mesh_axis && e.kind == Vary::Partial) return e.partial;
  return PartialKind::sum;
}

std::vector<std::string> VaryType::split_mesh_axes(const std::string& tensor_axis) const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    if (e.kind == Vary::Split && e.tensor_axis == tensor_axis) out.push_back(e.mesh_axis);
  return out;
}

namespace {
template <typename Pred>
std::vector<std::string> mesh_axes_where(const std::vector<VaryType::Entry>& entries, Pred pred) {
  std::vector<std::string> out;
  for (const auto& e : entries)
    if (pred(e)) out.push_back(e.mesh_axis);
  return out;
}
}  // namespace

std::vector<std::string> VaryType::varying_mesh_axes() const {
  return mesh_axes_where(entries_, [](const Entry& e) { return e.kind == Vary::Varying; });
}
std::vector<std::string> VaryType::partial_mesh_axes() const {
  return mesh_axes_where(entries_, [](const Entry& e) { return e.kind == Vary::Partial; });
}
std::vector<std::string> VaryType::unreduced_mesh_axes() const {
  return mesh_axes_where(entries_, [](const Entry& e) { return e.kind == Vary::Varying || e.kind == Vary::Partial; });
}

bool VaryType::any_partial() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.kind == Vary::Partial; });
}
bool VaryType::any_unreduced() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.kind == Vary::Varying || e.kind == Vary::Partial; });
}

void VaryType::set_invariant(const std::string& mesh_axis) {
  std::erase_if(entries_, [&](const Entry& e) { return e.mesh_axis == mesh_axis; });
}

void VaryType::set(Entry entry) {
  for (auto& e : entries_)
    if (e.mesh_axis == entry.mesh_axis) {
      e = std::move(entry);
      return;
    }
  entries_.push_back(std::move(entry));
}

void VaryType::set_varying(const std::string& mesh_axis) { set({mesh_axis, Vary::Varying, {}, PartialKind::sum}); }
void VaryType::set_partial(const std::string& mesh_axis, PartialKind kind) { set({mesh_axis, Vary::Partial, {}, kind}); }

void VaryType::set_split(const std::string& mesh_axis, const std::string& tensor_axis) {
  set_invariant(mesh_axis);
  entries_.push_back({mesh_axis, Vary::Split, tensor_axis, PartialKind::sum});
}

void VaryType::rename_tensor_axis(const std::string& from, const std::string& to) {
  for (auto& e : entries_)
    if (e.kind == Vary::Split && e.tensor_axis == from) e.tensor_axis = to;
}

std::string VaryType::str() const {
  const auto sums = mesh_axes_where(entries_, [](const Entry& e) { return e.kind == Vary::Partial && e.partial == PartialKind::sum; });
  const auto means = mesh_axes_where(entries_, [](const Entry& e) { return e.kind == Vary::Partial && e.partial == PartialKind::mean; });
  const auto varying = varying_mesh_axes();
  std::vector<std::string> parts;
  if (!varying.empty() || (sums.empty() && means.empty())) parts.push_back(fmt::format("varying{{{}}}", fmt::join(varying, ",")));
  if (!sums.empty()) parts.push_back(fmt::format("partial{{{}}}", fmt::join(sums, ",")));
  if (!means.empty()) parts.push_back(fmt::format("partial-mean{{{}}}", fmt::join(means, ",")));
  return fmt::format("{}", fmt::join(parts, " "));
}

}  // namespace nax
