#pragma once
// The tape the ops record on, define-by-run: when grad mode is on and an op's input needs a
// gradient, the op records its output's node (its inputs and its backward function, src/ops/tape.h).
// These decide what is recorded; grad() and remat (nax/autodiff/autodiff.h) walk the record.
#include "nax/tensor/tensor.h"

namespace nax {

// A leaf that gradients flow to: grad(loss, {p}) returns d loss / d p.
Tensor parameter(const Tensor& x);

// The same value, cut from the graph: no gradient flows through it.
Tensor stop_gradient(const Tensor& x);

// While alive, ops on this thread record nothing.
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool previous_;
};

bool grad_enabled();

}  // namespace nax
