#pragma once
// Reverse-mode autodiff, define-by-run: each device records the ops it runs; grad(loss, params)
// walks the record backwards. Every op's backward sits next to its forward (src/ops/), and the
// collectives use their transposes (nax/ops/collectives.h), so a replicated value feeding split
// weights gets its gradient all-reduced exactly once, without f/g operators written by hand.
#include <cstddef>
#include <functional>
#include <vector>

#include "nax/ops/tape.h"
#include "nax/tensor/tensor.h"

namespace nax {

// Gradients of a scalar `loss` with respect to `params` (each a parameter() or a value computed
// from one), with the params' shapes and vary types. The recorded graph behind `loss` is freed
// as it is walked: a second grad() through it is an error.
// A loss Varying over a mesh axis is refused: each device would differentiate only its own part
// (gradients off by the axis size, or missing the other devices' terms); reduce it with pmean or
// psum first, or opt out when per-device gradients are what you want.
//
// Gradients summed over mesh axes (a parameter Invariant over dp read by a batch cut over dp) go
// in buckets, as PyTorch DDP's: a parameter's sums join a bucket as soon as the walk has run every
// op that read the parameter, and a bucket's psum starts once it holds `bucket_bytes`, overlapping
// the rest of the backward; what is left is summed in one bucket per set of axes at the end.
// 0 sums everything at the end, as deterministic mode always does (it psums each contribution
// apart, then adds them in arrival order). Bucketing never changes a gradient's value. A bucket is
// summed in place and its gradients are pieces of it: like every tensor an op has read, they are
// immutable (write a copy).
struct GradOptions {
  bool allow_varying_loss = false;
  std::size_t bucket_bytes = std::size_t{25} << 20;  // DDP's bucket_cap_mb = 25
};
std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& params, GradOptions options = {});

// loss = fn(params) and its gradients, with params made parameters first.
std::pair<Tensor, std::vector<Tensor>> value_and_grad(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                                      const std::vector<Tensor>& params, GradOptions options = {});

// Reverse mode for schedules, as jax.vjp: vjp(fn, primals) runs outputs = fn(primals) now and
// keeps what their backward needs; pullback(cotangents), called once, later, with one cotangent
// per output (its shape, any axis order, the output's vary type or one that still needs a psum),
// returns one gradient per primal (zeros where no output depends on it). Between the two, other
// forwards and pullbacks may run: a pipeline stage runs micro-batch i+1's forward before micro-batch
// i's backward (1F1B). fn sees the primals as fresh leaves, so the gradient stops at them; a value
// fn reads from outside that needs a gradient must be a primal (an error names it otherwise).
// Collectives inside fn have their transposes run by the pullback, in reverse order.
struct Vjp {
  std::vector<Tensor> outputs;  // cut from the graph: use them freely
  std::function<std::vector<Tensor>(const std::vector<Tensor>& cotangents)> pullback;
};
Vjp vjp(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& primals);

// Activation checkpointing, as jax.checkpoint: y = fn(inputs), recording nothing inside fn. Only
// the values fn reads that need a gradient (its inputs and any tensors it captures, parameters
// included) are kept; grad() runs fn again, recording, and backpropagates through that recompute.
// A block's activations thus live only while its backward runs, for one more forward per block.
// fn must compute the same thing when called again (no RNG; collectives inside are fine, their
// transposes run in the recompute's backward) and whatever it captures must still be alive when
// grad() runs: capture by value. Nests (a remat inside fn is recomputed in turn) and composes with
// any op; under NoGrad it is fn(inputs).
Tensor remat(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs);
Tensor remat(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

}  // namespace nax
