#pragma once
// How a global tensor lies on one mesh axis (docs/architecture.md, Global view), as in PyTorch DTensor: every device
// along it holds the whole value (replicate), one block of a tensor axis (shard), or a partial
// value that the mesh axis still has to reduce (partial sum or max).
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "nax/core/reduce_op.h"

namespace nax {

// The reduction a partial value still needs: core's ReduceOp (the global view makes sum and max);
// vary_placement.h maps placements to vary types.
using PartialOp = ReduceOp;

class Placement {
 public:
  enum class Kind { replicate, shard, partial };

  static Placement replicate() { return Placement(Kind::replicate, "", PartialOp::sum); }
  static Placement shard(std::string tensor_axis) { return Placement(Kind::shard, std::move(tensor_axis), PartialOp::sum); }
  static Placement partial(PartialOp op = PartialOp::sum) { return Placement(Kind::partial, "", op); }

  Kind kind() const { return kind_; }
  bool is_replicate() const { return kind_ == Kind::replicate; }
  bool is_shard() const { return kind_ == Kind::shard; }
  bool is_partial() const { return kind_ == Kind::partial; }
  const std::string& axis() const { return axis_; }  // the tensor axis of a shard
  PartialOp op() const { return op_; }               // the reduction of a partial value

  std::string str() const;  // "R", "S(heads)", "P(sum)", "P(max)"
  bool operator==(const Placement&) const = default;

 private:
  Placement(Kind kind, std::string axis, PartialOp op) : kind_(kind), axis_(std::move(axis)), op_(op) {}
  Kind kind_;
  std::string axis_;
  PartialOp op_;
};

// A placement per mesh axis; a mesh axis not named is replicate. A tensor axis sharded over
// several mesh axes is cut in the mesh's axis order (the earlier mesh axis is the major one).
class Placements {
 public:
  Placements() = default;
  Placements(std::initializer_list<std::pair<std::string, Placement>> entries);

  const Placement& on(const std::string& mesh_axis) const;
  void set(const std::string& mesh_axis, Placement placement);
  // Mesh axes with a placement other than replicate, in the order they were set.
  const std::vector<std::pair<std::string, Placement>>& entries() const { return entries_; }

  std::string str() const;  // "{dp: S(batch), mp: P(sum)}", "{}" when replicated everywhere
  bool operator==(const Placements& other) const;

 private:
  std::vector<std::pair<std::string, Placement>> entries_;
};

}  // namespace nax
