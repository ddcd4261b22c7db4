#pragma once
// The named collectives of per-shard code (the full table with costs and vary rules: docs/collectives.md). Each takes one or several mesh axes;
// several axes act as one group, ranked row-major over the axes in the order given (except that
// the gathers and all_to_all rank a group by the order in which its mesh axes cut the gathered
// or concatenated tensor axis, so that blocks join in the tensor's order). Each records its call
// site (defaulted `where`): devices of a group at different calls fail, naming both sites.
//
//  op                              vary over mesh axis m            transpose (autodiff)
//  psum(x, m)                      Varying -> Invariant             pvary
//  pmean / pmax / pmin             Varying -> Invariant             pmean via psum / none
//  pvary(x, m)                     Invariant -> Varying             psum
//  all_gather(x, m, a)             Split(a)/Varying -> Varying      psum_scatter(., m, a)
//  all_gather_invariant(x, m, a)   Split(a)/Varying -> Invariant    own-block slice
//  all_gather_stacked(x, m, r)     Varying -> Varying (new axis r)  psum_scatter, drop r
//  all_gather_invariant_stacked    Varying -> Invariant             own-block slice, drop r
//  psum_scatter(x, m, a)           Varying -> Split(a)              all_gather(., m, a)
//  ppermute(x, m, pairs)           -> Varying                       ppermute(inverted pairs)
//  all_to_all(x, m, s, c)          Split(c) -> Split(s)             all_to_all(., m, c, s)
//  axis_index(m)                   Varying                          none
#include <source_location>
#include <utility>
#include <vector>

#include "nax/core/names.h"
#include "nax/tensor/tensor.h"

namespace nax {

Tensor psum(const Tensor& x, const Names& mesh_axes, std::source_location where = std::source_location::current());
Tensor pmean(const Tensor& x, const Names& mesh_axes, std::source_location where = std::source_location::current());
Tensor pmax(const Tensor& x, const Names& mesh_axes, std::source_location where = std::source_location::current());
Tensor pmin(const Tensor& x, const Names& mesh_axes, std::source_location where = std::source_location::current());
Tensor pvary(const Tensor& x, const Names& mesh_axes, std::source_location where = std::source_location::current());

// Concatenates the group's blocks along tensor axis `axis` of x. Refused: an axis x lacks (a typo
// would silently stack; stacking is all_gather_stacked), and a value Invariant over a gathered
// mesh axis (the devices' copies are equal: gathering them is a tiling, not a gather).
Tensor all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis,
                  std::source_location where = std::source_location::current());
Tensor all_gather_invariant(const Tensor& x, const Names& mesh_axes, const std::string& axis,
                            std::source_location where = std::source_location::current());
// Every tensor axis of x cut over mesh axes, gathered whole: all_gather_invariant over each cut
// (its other mesh axes, Varying or Invariant, as they were). A pipeline stage's parameter, Varying
// over pp, becomes the whole tensor of that stage.
Tensor all_gather_cuts(const Tensor& x, std::source_location where = std::source_location::current());
// Stacks the group's values along a new leading axis `new_axis` (size: the group's size).
Tensor all_gather_stacked(const Tensor& x, const Names& mesh_axes, const std::string& new_axis,
                          std::source_location where = std::source_location::current());
Tensor all_gather_invariant_stacked(const Tensor& x, const Names& mesh_axes, const std::string& new_axis,
                                    std::source_location where = std::source_location::current());
// Sums over the group and keeps this device's block of `axis`.
Tensor psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis,
                    std::source_location where = std::source_location::current());
// Sends x from group rank src to group rank dst for each (src, dst); a rank that is no pair's
// destination receives zeros.
Tensor ppermute(const Tensor& x, const Names& mesh_axes,
                const std::vector<std::pair<int, int>>& pairs, std::source_location where = std::source_location::current());
// Cuts `split_axis` into group-size blocks, sends block j to rank j, concatenates what arrives
// along `concat_axis` in rank order.
Tensor all_to_all(const Tensor& x, const Names& mesh_axes, const std::string& split_axis,
                  const std::string& concat_axis, std::source_location where = std::source_location::current());

// This device's coordinate in the group (an i32 scalar, Varying), and the group's size.
Tensor axis_index(const Names& mesh_axes);
int axis_size(const Names& mesh_axes);

}  // namespace nax
