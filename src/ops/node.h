#pragma once
// The recorded graph: one Node per op output that needs a gradient. A node keeps its inputs (and
// through them their nodes) and a backward function holding what the op saved; both are released
// when backward has run through the node.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nax/autodiff.h"

namespace nax::autodiff {

// d loss / d inputs from d loss / d output; an undefined Tensor means "no gradient".
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

struct Node {
  std::string op;
  std::vector<Tensor> inputs;  // empty for a parameter leaf
  BackwardFn backward;
  bool leaf = false;
  bool released = false;
  // The op is the same elementwise linear map on every device (cast): a gradient still to be
  // summed over mesh axes may pass through it unsummed and be summed at the input instead (where
  // it joins the other parameters' sums, in the input's dtype).
  bool passes_partial_sums = false;
  // Creation order (every node is made after its inputs' nodes): backward runs nodes from the
  // latest made, the reverse of the forward program, so that the backward of what ran between a
  // started collective's start and wait runs between its transpose's start and wait.
  std::uint64_t sequence = next_sequence();

  static std::uint64_t next_sequence();
};

// Records `out` as computed by `op` from `inputs` when grad mode is on and an input requires a
// gradient; returns `out`, carrying its node. `backward` receives the gradient of `out` and
// returns one gradient per input, in order.
Tensor record(std::string op, const Tensor& out, std::vector<Tensor> inputs, BackwardFn backward);

// Whether any of `inputs` needs a gradient (and grad mode is on): ops skip saving otherwise.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);

}  // namespace nax::autodiff
