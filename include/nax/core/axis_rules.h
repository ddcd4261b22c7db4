#pragma once
// Axis rules: which mesh axes cut which tensor axis (xmap's axis_resources).
// AxisRules{{"batch", "dp"}, {"heads", "mp"}}, or several mesh axes for one tensor axis, major first:
// AxisRules{{"batch", {"dp", "mp"}}}.
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "nax/core/mesh.h"
#include "nax/core/names.h"

namespace nax {

class AxisRules {
 public:
  struct Rule {
    std::string tensor_axis;
    std::vector<std::string> mesh_axes;
    Rule(std::string axis, const Names& mesh_axes);
  };

  AxisRules() = default;
  AxisRules(std::initializer_list<Rule> rules);
  static AxisRules parse(std::string_view spec);  // "batch=dp,heads=mp,tokens=dp+mp"

  void set(const std::string& tensor_axis, std::vector<std::string> mesh_axes);
  // The mesh axes cutting `tensor_axis` (empty when it is not cut).
  const std::vector<std::string>& mesh_axes(const std::string& tensor_axis) const;
  const std::map<std::string, std::vector<std::string>>& rules() const { return rules_; }

  // Checks the rules against a mesh and a global shape: mesh axes exist and are used once, sizes
  // divide. Throws naming `op`, the axes and the shape.
  void check(const Mesh& mesh, const Shape& global, std::string_view op) const;

  std::string str() const;

 private:
  std::map<std::string, std::vector<std::string>> rules_;
};

// The axis rules applied during one run and the tensor axes of the global tensors they cut. A rule
// whose tensor axis none of them carried, while they carry a name an edit or two away from it (a
// letter added, dropped, changed or swapped with its neighbour, or another case), is a misspelling
// ("heads" for "head") that leaves tensors silently whole; so are rules of which none cut anything.
// Other unused rules are left alone unless every rule must cut (RuntimeOptions::strict_axis_rules):
// a model's rules also name the axes of tensors other runs make ("batch" in a run that only makes
// parameters).
class RulesUse {
 public:
  void note(const AxisRules& rules, const Shape& global);
  // Throws naming a misspelled rule, the axes the tensors carried and the closest of them; or the
  // rules when none cut anything; or, with `every_rule`, any rule that cut nothing.
  void check_all_used(bool every_rule = false) const;

 private:
  std::map<std::string, std::vector<std::string>> rules_;  // tensor axis -> its mesh axes
  std::set<std::string> seen_;
};

}  // namespace nax
