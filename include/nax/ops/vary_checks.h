#pragma once
// Checked casts between vary types, and assertions about them (an out_specs for per-shard code);
// docs/collectives.md "Checked casts and assertions".
//
// Checking mode (NAX_CHECK=1 in the environment): values typed Invariant are compared across the
// devices of their Invariant mesh axes by expect_vary, by Shard::gather and, when the run ends, for
// the tensors Runtime::run returns, so a per-device value that was never marked Varying (e.g.
// full(shape, s.device())) is an error naming the devices that differ, not device 0's copy.
#include <source_location>
#include <string>
#include <string_view>

#include "nax/core/names.h"
#include "nax/tensor/tensor.h"

namespace nax {

// Split or Partial over `mesh_axes` -> Varying: forgets which block each device holds, or that
// each holds a term of a sum (to scale or select each device's term its own way on purpose); no
// data moves. Transpose: the gradient is Split again (Varying for a partial value).
Tensor as_varying(const Tensor& x, const Names& mesh_axes);
// Varying or Partial over `mesh_axes` -> Split(axis), the most minor cuts of `axis` in the order
// named: the caller asserts that the devices hold the blocks of one tensor in group rank order (a
// reduce-scatter written by hand with ppermute ends with partial-typed blocks that are whole).
// Already Split along `axis` over a mesh axis: left so. Refused over an Invariant mesh axis or one
// that cuts another axis, and along an axis x lacks. Transpose: as_varying.
Tensor as_split(const Tensor& x, const Names& mesh_axes, const std::string& axis);
// Varying over `mesh_axes` -> Partial (a partial sum): the caller asserts that each device holds
// one term of a sum over the group, so that it may be added to other partial sums and psummed.
// Refused over an Invariant, Split or already Partial mesh axis. Transpose: the gradient as it is.
Tensor as_partial(const Tensor& x, const Names& mesh_axes);

// Asserts x's vary type. `spec`: "mesh_axis=varying", "mesh_axis=partial" (a partial sum),
// "mesh_axis=partial-mean" (a local mean) or "mesh_axis=tensor_axis" (Split along it; several mesh
// axes cutting one tensor axis are listed major first), comma-separated; mesh axes not named must
// be Invariant. E.g. expect_vary(y, "dp=batch,mp=partial"). In checking mode the Invariant axes
// are also compared across devices.
void expect_vary(const Tensor& x, std::string_view spec, std::source_location where = std::source_location::current());

// Whether the running shard is in checking mode (RuntimeOptions::check_values, NAX_CHECK=1).
bool checking_enabled();
// Compares x across the devices of the mesh axes over which it is typed Invariant (a hash of its
// values): an error naming `what` when they differ. Call inside Runtime::run.
void check_invariant(const Tensor& x, std::string_view what);

}  // namespace nax
