// Activation checkpointing (nax/autodiff.h): a forward that records nothing but the values it
// reads, and a backward that recomputes and walks the recompute's graph down to those values.
#include <unordered_map>

#include "autodiff/backward.h"
#include "nax/core/error.h"

namespace nax {

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// A gradient as the outer walk accumulates it: still unsummed over the mesh axes where the value
// is Invariant but the contributions vary (the outer pass psums it once, bucketed with the other
// gradients), unless parts already whole and parts still to sum met: those are finished here.
Tensor as_contribution(const autodiff::Pending& p) {
  return p.sums.size() == 1 && p.terms.empty() ? p.sums.begin()->second : autodiff::finish(p);
}

// d loss / d captured from d loss / d y: runs fn again, recording, and backpropagates g through
// the nodes it made (those made from `floor` on), stopping at the values from outside.
std::vector<Tensor> recompute_backward(const Fn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& captured,
                                       const Shape& first_shape, DType first_dtype, const Tensor& g) {
  const std::uint64_t floor = autodiff::Node::next_sequence();
  Tensor y;
  {
    autodiff::EnableGrad recording;
    y = fn(inputs);
  }
  if (!y.defined() || y.shape() != first_shape || y.dtype() != first_dtype)
    fail("remat", "the function gave {} when recomputed in backward but {}{} the first time: it must compute the same thing again",
         y.str(), dtype_name(first_dtype), first_shape.str());
  std::vector<Tensor> out(captured.size());
  if (!y.requires_grad()) return out;
  std::unordered_map<const autodiff::Node*, std::size_t> index;
  for (std::size_t i = 0; i < captured.size(); ++i) index[captured[i].grad_node().get()] = i;
  const autodiff::Grads grads = autodiff::backpropagate(y, g, {}, floor);
  std::vector<const autodiff::Pending*> by_input(captured.size(), nullptr);
  for (const auto& [node, pending] : grads) {
    if (node->sequence >= floor) continue;  // a leaf made inside fn: nobody asked for its gradient
    auto it = index.find(node);
    if (it == index.end())
      fail("remat", "the function read {}, which needs a gradient, when recomputed in backward but not the first time: it must "
           "compute the same thing again", pending.like.str());
    by_input[it->second] = &pending;
  }
  // In the inputs' order, not the map's: finishing may psum, and every device must call its
  // collectives in the same order.
  for (std::size_t i = 0; i < by_input.size(); ++i)
    if (by_input[i] != nullptr) out[i] = as_contribution(*by_input[i]);
  return out;
}

}  // namespace

Tensor remat(const Fn& fn, const std::vector<Tensor>& inputs) {
  if (!fn) fail("remat", "the function is empty");
  if (!grad_enabled()) return fn(inputs);  // nothing is recorded (NoGrad, or inside another remat's forward)
  Tensor out;
  std::vector<Tensor> captured;
  {
    autodiff::CaptureInputs capture;
    out = fn(inputs);
    captured = capture.inputs();
  }
  if (!out.defined()) fail("remat", "the function returned an undefined tensor");
  if (captured.empty()) return out;
  return autodiff::record("remat", out, captured, [fn, inputs, captured, shape = out.shape(), dtype = out.dtype()](const Tensor& g) {
    return recompute_backward(fn, inputs, captured, shape, dtype, g);
  });
}

Tensor remat(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  if (!fn) fail("remat", "the function is empty");
  return remat([fn](const std::vector<Tensor>& in) { return fn(in[0]); }, std::vector<Tensor>{x});
}

}  // namespace nax
