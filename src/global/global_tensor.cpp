#include "nax/global/global_tensor.h"

#include <fmt/format.h>

#include <ostream>

#include "nax/global/global_ops.h"
#include "nax/global/vary_placement.h"
#include "nax/runtime/runtime.h"

namespace nax {

namespace {

const Mesh& current_mesh(std::string_view op) {
  Shard* s = Shard::current();
  if (s == nullptr) fail(op, "global tensors live inside Runtime::run");
  return s->mesh();
}

// The global shape: each sharded axis times the sizes of the mesh axes cutting it.
Shape global_shape(const Tensor& local, const Mesh& mesh) {
  std::vector<Axis> axes = local.shape().axes();
  for (auto& axis : axes)
    for (const auto& m : local.vary().split_mesh_axes(axis.name)) axis.size *= mesh.axis_size(m);
  return Shape(std::move(axes));
}

}  // namespace

GlobalTensor GlobalTensor::from_local(const Tensor& local, const std::map<std::string, PartialOp>& partial_ops) {
  if (!local.defined()) fail("GlobalTensor::from_local", "the tensor is undefined");
  const Mesh& mesh = current_mesh("GlobalTensor::from_local");
  Placements placements;
  for (const auto& m : mesh.axis_names()) {
    const Vary kind = local.vary().kind(m);
    auto it = partial_ops.find(m);
    // A local mean summed over m would be n times the mean: a partial placement cannot hold it.
    if (local.vary().local_mean(m) && it == partial_ops.end())
      fail("GlobalTensor::from_local", "{} is a local mean over mesh axis '{}' (a mean over a tensor axis cut along it), which a "
           "partial-sum placement would sum to {} times the mean; pmean it over '{}' first", local.str(), m, mesh.axis_size(m), m);
    // Per-device values are no partial reduction until told which (a max over a cut axis is one of a max).
    if (kind == Vary::Varying && it == partial_ops.end())
      fail("GlobalTensor::from_local", "{} is Varying over mesh axis '{}' (per-device values): say how the global value reduces "
           "them, partial_ops {{{{\"{}\", ReduceOp::max}}}} for per-device maxima or ReduceOp::sum for terms of a sum (or reduce "
           "it with pmax / psum first)", local.str(), m, m);
    if (kind == Vary::Partial && local.vary().partial_sum(m) && it != partial_ops.end() && it->second != ReduceOp::sum)
      fail("GlobalTensor::from_local", "{} is a partial sum over mesh axis '{}': its placement is Partial(sum), not the {} given",
           local.str(), m, reduce_op_name(it->second));
    const Placement p = placement_of(kind, kind == Vary::Split ? local.vary().split_axis(m) : std::string(),
                                     it == partial_ops.end() ? ReduceOp::sum : it->second);
    if (!p.is_replicate()) placements.set(m, p);
  }
  for (const auto& axis : local.shape().names()) {
    auto cuts = local.vary().split_mesh_axes(axis);
    for (std::size_t i = 1; i < cuts.size(); ++i)
      if (mesh.axis_position(cuts[i - 1]) > mesh.axis_position(cuts[i]))
        fail("GlobalTensor::from_local", "{}: axis '{}' is cut over mesh axes ({}) out of the mesh's order; the global view cuts "
             "an axis over several mesh axes major first in mesh order ({})", local.str(), axis, fmt::join(cuts, ", "), mesh.str());
  }
  return GlobalTensor(local, std::move(placements), global_shape(local, mesh));
}

GlobalTensor GlobalTensor::from_host(const Tensor& host, const AxisRules& rules) {
  Shard* s = Shard::current();
  if (s == nullptr) fail("GlobalTensor::from_host", "global tensors live inside Runtime::run");
  return from_local(s->shard(host, rules));
}

Tensor GlobalTensor::to_host() const {
  if (!defined()) fail("GlobalTensor::to_host", "the tensor is undefined");
  Placements whole;
  for (const auto& [m, p] : placements_.entries())
    if (p.is_shard()) whole.set(m, p);
  return Shard::current()->gather(redistribute(*this, whole).local());
}

double GlobalTensor::item() const {
  if (!defined() || shape().numel() != 1) fail("GlobalTensor::item", "needs a one-element tensor, got {}", str());
  return redistribute(*this, Placements{}).local().item();
}

std::string GlobalTensor::str() const {
  if (!defined()) return "undefined";
  return fmt::format("{}{} {}", dtype_name(local_.dtype()), shape_.str(), placements_.str());
}

std::ostream& operator<<(std::ostream& os, const GlobalTensor& t) { return os << t.str(); }

}  // namespace nax
