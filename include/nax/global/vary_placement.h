#pragma once
// One concept, two views. Over one mesh axis, a per-shard tensor's vary type (nax/core/vary.h) and
// a global tensor's placement (placement.h) say the same thing, and this header is the one place
// that maps them:
//   Vary::Invariant   <->  Placement::replicate()      every device holds the same value
//   Vary::Split (a)   <->  Placement::shard(a)         every device holds one block of tensor axis a
//   Vary::Partial     <->  Placement::partial(sum)     every device holds one term of a sum
//   Vary::Varying     <->  Placement::partial(max)     the devices hold values still to reduce with max
// (Varying also covers per-device values that are no partial reduction; the global view never
// makes those.) A partial placement's reduction is core's ReduceOp.
#include <string>

#include "nax/core/reduce_op.h"
#include "nax/core/vary.h"
#include "nax/global/placement.h"

namespace nax {

// The placement of a value whose vary type over a mesh axis is `kind` (`split_axis`: the tensor
// axis of a Split; `partial`: the reduction a Varying value still needs).
inline Placement placement_of(Vary kind, const std::string& split_axis, ReduceOp partial = ReduceOp::sum) {
  switch (kind) {
    case Vary::Split: return Placement::shard(split_axis);
    case Vary::Partial:
    case Vary::Varying: return Placement::partial(partial);
    case Vary::Invariant: break;
  }
  return Placement::replicate();
}

// The vary type a placement gives the per-shard value (a shard's tensor axis is placement.axis()).
inline Vary vary_of(const Placement& placement) {
  if (placement.is_shard()) return Vary::Split;
  if (placement.is_partial()) return placement.op() == ReduceOp::sum ? Vary::Partial : Vary::Varying;
  return Vary::Invariant;
}

}  // namespace nax
