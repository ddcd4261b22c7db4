#include "nax/core/axis_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "nax/core/error.h"

namespace nax {

AxisRules::Rule::Rule(std::string axis, const Names& axes) : tensor_axis(std::move(axis)), mesh_axes(axes.list()) {}

AxisRules::AxisRules(std::initializer_list<Rule> rules) {
  for (const auto& r : rules) set(r.tensor_axis, r.mesh_axes);
}

AxisRules AxisRules::parse(std::string_view spec) {
  AxisRules rules;
  std::string_view rest = spec;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      fail("AxisRules::parse", "'{}' in \"{}\" is not tensor_axis=mesh_axis[+mesh_axis]", item, spec);
    std::vector<std::string> mesh_axes;
    std::string_view axes = item.substr(eq + 1);
    while (true) {
      auto plus = axes.find('+');
      mesh_axes.emplace_back(axes.substr(0, plus));
      if (plus == std::string_view::npos) break;
      axes = axes.substr(plus + 1);
    }
    rules.set(std::string(item.substr(0, eq)), std::move(mesh_axes));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return rules;
}

void AxisRules::set(const std::string& tensor_axis, std::vector<std::string> mesh_axes) {
  if (mesh_axes.empty()) {
    rules_.erase(tensor_axis);
    return;
  }
  std::set<std::string> seen;
  for (const auto& m : mesh_axes) {
    if (m.empty()) fail("AxisRules", "empty mesh axis name in the rule for '{}'", tensor_axis);
    if (!seen.insert(m).second) fail("AxisRules", "mesh axis '{}' named twice in the rule for '{}'", m, tensor_axis);
  }
  rules_[tensor_axis] = std::move(mesh_axes);
}

const std::vector<std::string>& AxisRules::mesh_axes(const std::string& tensor_axis) const {
  static const std::vector<std::string> none;
  auto it = rules_.find(tensor_axis);
  return it == rules_.end() ? none : it->second;
}

void AxisRules::check(const Mesh& mesh, const Shape& global, std::string_view op) const {
  std::map<std::string, std::string> used;  // mesh axis -> tensor axis
  for (const auto& [tensor_axis, mesh_axes] : rules_) {
    int index = global.index_of(tensor_axis);
    for (const auto& m : mesh_axes) {
      if (!mesh.has(m))
        fail(op, "rule {}={} names unknown mesh axis '{}' (mesh is {}; tensor {})", tensor_axis, fmt::join(mesh_axes, "+"), m,
             mesh.str(), global.str());
      if (index < 0) continue;
      auto [it, fresh] = used.emplace(m, tensor_axis);
      if (!fresh)
        fail(op, "mesh axis '{}' cuts both '{}' and '{}' of {}", m, it->second, tensor_axis, global.str());
    }
    if (index < 0) continue;
    std::int64_t parts = mesh.group_size(mesh_axes);
    std::int64_t size = global[index].size;
    if (size % parts != 0)
      fail(op, "axis '{}' of size {} in {} is not divisible by mesh axes {} of size {}", tensor_axis, size,
           global.str(), fmt::join(mesh_axes, "+"), parts);
  }
}

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
// adjacent letters each count one ("haeds" is one edit from "heads"); letters compare ignoring
// case ("Heads", "MLP").
std::size_t edit_distance(const std::string& a, const std::string& b) {
  auto same = [](char x, char y) { return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y)); };
  std::vector<std::size_t> before(b.size() + 1), above(b.size() + 1), row(b.size() + 1);  // rows i-2, i-1, i
  for (std::size_t j = 0; j <= b.size(); ++j) above[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      row[j] = std::min({above[j] + 1, row[j - 1] + 1, above[j - 1] + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1])) row[j] = std::min(row[j], before[j - 2] + 1);
    }
    std::swap(before, above), std::swap(above, row);
  }
  return above[b.size()];
}

// The seen axis closest to `name` within a third of its letters (at least one), or "". Names of one
// or two letters are all close to each other: for them only a difference of case counts.
std::string near_name(const std::string& name, const std::set<std::string>& seen) {
  std::string best;
  std::size_t best_distance = name.size() < 3 ? 1 : std::max<std::size_t>(1, name.size() / 3) + 1;
  for (const auto& s : seen)
    if (const std::size_t d = edit_distance(name, s); d < best_distance) best = s, best_distance = d;
  return best;
}

std::string rule_text(const std::string& tensor_axis, const std::vector<std::string>& mesh_axes) {
  return fmt::format("{}={}", tensor_axis, fmt::join(mesh_axes, "+"));
}

}  // namespace

void RulesUse::note(const AxisRules& rules, const Shape& global) {
  for (const auto& [tensor_axis, mesh_axes] : rules.rules()) rules_[tensor_axis] = mesh_axes;
  for (const auto& name : global.names()) seen_.insert(name);
}

void RulesUse::check_all_used(bool every_rule) const {
  std::vector<std::string> unused;
  for (const auto& [tensor_axis, mesh_axes] : rules_) {
    if (seen_.contains(tensor_axis)) continue;
    if (const std::string near = near_name(tensor_axis, seen_); !near.empty())
      fail("AxisRules", "the rule {} cut nothing in this run: no tensor cut with axis rules carries an axis '{}' (their axes: "
           "{}); did you mean '{}'?", rule_text(tensor_axis, mesh_axes), tensor_axis, fmt::join(seen_, ", "), near);
    unused.push_back(rule_text(tensor_axis, mesh_axes));
  }
  if (unused.empty()) return;
  if (unused.size() == rules_.size())
    fail("AxisRules", "the axis rules applied in this run cut nothing: no tensor made with them carries the axis of any rule ({}; "
         "their axes: {}), so every tensor stayed whole; name in the rules the tensor axes to cut", fmt::join(unused, ", "),
         fmt::join(seen_, ", "));
  if (every_rule)
    fail("AxisRules", "the rule{} {} cut nothing in this run: no tensor cut with axis rules carries {} (their axes: {}); "
         "RuntimeOptions::strict_axis_rules asks every rule applied in a run to cut a tensor of it", unused.size() > 1 ? "s" : "",
         fmt::join(unused, ", "), unused.size() > 1 ? "their axes" : "its axis", fmt::join(seen_, ", "));
}

std::string AxisRules::str() const {
  std::vector<std::string> parts;
  for (const auto& [t, m] : rules_) parts.push_back(fmt::format("{}={}", t, fmt::join(m, "+")));
  return fmt::format("{{{}}}", fmt::join(parts, ", "));
}

}  // namespace nax
