#pragma once
// GlobalTensor: the global view (docs/architecture.md, Global view). A logical tensor, written about as if on one
// device, of which each device holds its local block; its placement on every mesh axis says how
// (nax/global/placement.h). Ops on global tensors (nax/global/global_ops.h) choose a sharding strategy,
// redistribute their inputs and run the per-shard op on the blocks, so the per-shard machinery
// (vary types, collectives and their transposes, autodiff) carries over unchanged: a replicated
// value is an Invariant block, a shard a Split block, a partial value a Varying block.
#include <map>
#include <string>

#include "nax/core/axis_rules.h"
#include "nax/global/placement.h"
#include "nax/tensor/tensor.h"

namespace nax {

class GlobalTensor {
 public:
  GlobalTensor() = default;

  // Wraps a per-shard block: Invariant -> replicate, Split(a) -> shard(a), a partial sum ->
  // partial(sum); Varying (per-device values) -> partial of the op `partial_ops` gives for that
  // mesh axis, refused without one (as a local mean is). Runs inside Runtime::run.
  static GlobalTensor from_local(const Tensor& local, const std::map<std::string, PartialOp>& partial_ops = {});
  // This device's block of a host tensor, cut by `rules` (every device calls it).
  static GlobalTensor from_host(const Tensor& host, const AxisRules& rules);

  bool defined() const { return local_.defined(); }
  const Tensor& local() const { return local_; }
  const Shape& shape() const { return shape_; }  // the global shape
  DType dtype() const { return local_.dtype(); }
  std::int64_t size(const std::string& axis) const { return shape().size(axis); }
  int rank() const { return local_.rank(); }
  const Placement& placement(const std::string& mesh_axis) const { return placements_.on(mesh_axis); }
  const Placements& placements() const { return placements_; }

  // The whole tensor on the host (every device calls it; partial values are reduced first).
  Tensor to_host() const;
  // The value of a one-element tensor (partial values are reduced first).
  double item() const;
  bool requires_grad() const { return local_.requires_grad(); }

  std::string str() const;  // "f32[batch=8, seq=64] {dp: S(batch)}"

 private:
  GlobalTensor(Tensor local, Placements placements, Shape shape)
      : local_(std::move(local)), placements_(std::move(placements)), shape_(std::move(shape)) {}
  Tensor local_;
  Placements placements_;
  Shape shape_;
};

std::ostream& operator<<(std::ostream& os, const GlobalTensor& t);

}  // namespace nax
