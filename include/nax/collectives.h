#pragma once
// The named collectives of per-shard code (DESIGN.md §3). Each takes one or several mesh axes;
// several axes act as one group, ranked row-major over the axes in the order given.
//
//  op                              vary over mesh axis m            transpose (autodiff)
//  psum(x, m)                      Varying -> Invariant             pvary
//  pmean / pmax / pmin             Varying -> Invariant             pmean via psum / none
//  pvary(x, m)                     Invariant -> Varying             psum
//  all_gather(x, m, a)             Split(a)/Varying -> Varying      psum_scatter(., m, a)
//  all_gather_invariant(x, m, a)   Split(a)/Varying -> Invariant    own-block slice
//  psum_scatter(x, m, a)           Varying -> Split(a)              all_gather(., m, a)
//  ppermute(x, m, pairs)           -> Varying                       ppermute(inverted pairs)
//  all_to_all(x, m, s, c)          Split(c) -> Split(s)             all_to_all(., m, c, s)
//  axis_index(m)                   Varying                          none
#include <utility>
#include <vector>

#include "nax/core/names.h"
#include "nax/tensor.h"

namespace nax {

Tensor psum(const Tensor& x, const Names& mesh_axes);
Tensor pmean(const Tensor& x, const Names& mesh_axes);
Tensor pmax(const Tensor& x, const Names& mesh_axes);
Tensor pmin(const Tensor& x, const Names& mesh_axes);
Tensor pvary(const Tensor& x, const Names& mesh_axes);

// Concatenates the group's blocks along tensor axis `axis`, or stacks them along a new leading
// axis `axis` when x has no such axis.
Tensor all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis);
Tensor all_gather_invariant(const Tensor& x, const Names& mesh_axes, const std::string& axis);
// Sums over the group and keeps this device's block of `axis`.
Tensor psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis);
// Sends x from group rank src to group rank dst for each (src, dst); a rank that is no pair's
// destination receives zeros.
Tensor ppermute(const Tensor& x, const Names& mesh_axes,
                const std::vector<std::pair<int, int>>& pairs);
// Cuts `split_axis` into group-size blocks, sends block j to rank j, concatenates what arrives
// along `concat_axis` in rank order.
Tensor all_to_all(const Tensor& x, const Names& mesh_axes, const std::string& split_axis,
                  const std::string& concat_axis);

// This device's coordinate in the group (an i32 scalar, Varying), and the group's size.
Tensor axis_index(const Names& mesh_axes);
int axis_size(const Names& mesh_axes);

}  // namespace nax
