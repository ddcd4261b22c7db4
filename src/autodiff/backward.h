#pragma once
// The reverse pass over the tape, shared by grad() and remat's backward (which walks the graph of
// its recompute down to the values it read from outside).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ops/tape.h"

namespace nax::autodiff {

struct StartedBucket;  // autodiff.cpp: a bucket of gradients whose psum the walk has started

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
  // Sums moved into buckets whose psum started during the walk (a parameter's, once complete): the
  // bucket, this value's piece of it and the mesh axes it was kept under in `sums`.
  struct Started {
    std::shared_ptr<StartedBucket> bucket;
    std::size_t piece = 0;
    std::vector<std::string> axes;
  };
  std::vector<Started> started;
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
// With bucket_bytes > 0 (outside deterministic mode), a wanted leaf's sums still to psum are laid
// in a bucket as soon as no node left to run reads the leaf, and a bucket's psum is started once it
// holds bucket_bytes, so that it overlaps the rest of the walk (PyTorch DDP's buckets); buckets
// left under the size are summed by gradients_of, as all are with bucket_bytes = 0.
Grads backpropagate(const Tensor& root, const Tensor& seed, const std::unordered_set<Node*>& wanted, std::uint64_t floor,
                    std::size_t bucket_bytes = 0);

}  // namespace nax::autodiff
