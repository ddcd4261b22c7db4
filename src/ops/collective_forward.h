#pragma once
// The forward halves of the collectives that have start forms (collectives.cpp), for
// async_collectives.cpp: the same checks, vary rules and packing, blocking or started by `launch`.
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "nax/core/names.h"
#include "nax/ops/async_collectives.h"
#include "comm/launch.h"

namespace nax::detail {

// The site of a collective called at `where`: inside a transpose (BackwardOf), the forward's.
CallSite site_of(const std::source_location& where);
// `forward` (the site of the forward call just made) marked with that call's number on its group,
// for its transpose to carry.
CallSite transposing_site(CallSite forward);

// While alive, collectives run as the backward of `op` (which outlives the scope) called at `site`.
class BackwardOf {
 public:
  BackwardOf(const char* op, CallSite site);
  ~BackwardOf();
  BackwardOf(const BackwardOf&) = delete;
  BackwardOf& operator=(const BackwardOf&) = delete;

 private:
  CallSite site_;
  const CallSite* previous_;
};

// `where`: the user's call, part of the signature the group compares.
Tensor launch_psum(const Tensor& x, const Names& mesh_axes, Launch& launch, std::source_location where);
// psum(x, m), blocking or started, written over x's own storage (Launch::write_over_input): for a
// buffer its caller made and handed to no one (autodiff's gradient buckets), so that summing it
// takes no second one. No gradient is recorded.
Tensor psum_over_input(const Tensor& x, const Names& mesh_axes, std::source_location where = std::source_location::current());
Pending<Tensor> start_psum_over_input(const Tensor& x, const Names& mesh_axes,
                                      std::source_location where = std::source_location::current());
// Deterministic mode: a sum of partial sums reduced over some of the mesh axes its terms are
// partial over stays a sum of terms over the others (of one device, too: the program is then the
// same on every mesh, as the locator compares it op by op): each
// term is reduced alone and the terms added after, so that the last reduction still finishes each
// term in the tree and adds them in order. psum over cp, then over mp thus adds as one psum over
// both where the mesh lists mp before cp (a group is ranked in mesh order); summed as one value,
// the terms' partial sums over cp would be added before their sums over mp.
bool keeps_terms(const Tensor& x, const Names& mesh_axes);
// Deterministic mode: psum of each of several values of one shape and dtype over the same mesh
// axes (the terms of a value autodiff keeps apart), in one call of a communicator that reads them
// where they lie (Communicator::all_reduce_parts) and adds in the rank tree: their sums side by side
// in one buffer, handed out as pieces of it; no gradient is recorded. Empty otherwise (another
// mode, bf16, shapes that differ, or another communicator: the caller lays the values end to end in
// a bucket instead).
std::vector<Tensor> psum_alike(const std::vector<Tensor>& parts, const Names& mesh_axes,
                               std::source_location where = std::source_location::current());
Tensor launch_all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch, std::source_location where);
Tensor launch_all_gather_invariant(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch,
                                   std::source_location where);
Tensor launch_psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis, Launch& launch,
                           std::source_location where);
Tensor launch_ppermute(const Tensor& x, const Names& mesh_axes, const std::vector<std::pair<int, int>>& pairs, Launch& launch,
                       std::source_location where);
// The group's mesh axes in the order they cut `axis` of x (then the others): a gather joins
// blocks in the tensor's order, and its transpose scatters over the same group.
Names gather_order(const Tensor& x, const Names& mesh_axes, const std::string& axis);
// The gradient of a gather's input from the gradient of its result's own block.
Tensor unstack_gradient(const Tensor& g, const Tensor& x, const std::string& axis);
// Whether a gradient is Invariant over every axis of the group (summed already).
bool summed_over(const Tensor& g, const Names& group);
// An invariant gather's transpose of a summed gradient: this device's block of it, no communication.
Tensor own_block(const Tensor& g, const Tensor& x, const Names& group, const std::string& axis);

// "(0, 1) (1, 0)": a ppermute's pairs as its messages name them.
std::string pairs_text(const std::vector<std::pair<int, int>>& pairs);
// The pairs reversed: a ppermute's transpose sends each block back.
std::vector<std::pair<int, int>> inverse_pairs(const std::vector<std::pair<int, int>>& pairs);

}  // namespace nax::detail
