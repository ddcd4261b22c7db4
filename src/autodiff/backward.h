#pragma once
// The reverse pass over the tape, shared by grad() and remat's backward (which walks the graph of
// its recompute down to the values it read from outside).
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ops/tape.h"

namespace nax::autodiff {

// A value's gradient while the contributions of its consumers come in: their sums so far, kept
// apart by the mesh axes over which a contribution varies while the value is Invariant (those
// still need a psum; a contribution that is already whole must not be summed again), and the
// value (shape, dtype, vary type) it is the gradient of.
struct Pending {
  std::map<std::vector<std::string>, Tensor> sums;  // by the mesh axes still to psum over
  Tensor like;
  // Deterministic mode: every contribution apart, in arrival order, with the mesh axes it still
  // needs a psum over; finished by psum-ing each and adding them in that order, as one device
  // adds them (summing partial contributions before their psum would depend on the mesh).
  std::vector<std::pair<std::vector<std::string>, Tensor>> terms;
};

using Grads = std::unordered_map<Node*, Pending>;

// The vary type a gradient of `like` takes: like's, except that the gradient of a partial value
// is Varying: it is the gradient of the whole (psum's transpose broadcasts it), scaled by whatever
// per-device factors the partial met, not itself a term of a sum waiting for its psum.
VaryType gradient_vary(const Tensor& like);

// Adds one consumer's contribution to a value's gradient.
void accumulate(Pending& p, const Tensor& g_in, const std::string& op);

// Finished gradients (their psums bucketed: see autodiff.cpp); undefined where a pending is null.
// The pendings' contributions are taken (so that each is freed once in its bucket).
std::vector<Tensor> finish_bucketed(const std::vector<Pending*>& pendings);
Tensor finish(const Pending& p);
// The finished gradients of `params` (leaves the walk was asked for) from a walk's pendings,
// their psums bucketed; zeros for a param the walk did not reach.
std::vector<Tensor> gradients_of(Grads grads, const std::vector<Tensor>& params);

// Backpropagates `seed` (d loss / d root) through every node reachable from root and made at or
// after `floor` (Node::sequence), freeing each; returns the gradients pending at the nodes it
// stops at: leaves, `wanted` nodes (also propagated through), and nodes made before `floor`.
Grads backpropagate(const Tensor& root, const Tensor& seed, const std::unordered_set<Node*>& wanted, std::uint64_t floor);

}  // namespace nax::autodiff
