// Activation checkpointing (nax/autodiff/autodiff.h): a forward that records nothing but the values it
// reads, and a backward that recomputes and walks the recompute's graph down to those values.
#include <optional>
#include <unordered_map>

#include "autodiff/backward.h"
#include "nax/core/error.h"
#include "nax/ops/vary_checks.h"
#include "ops/internal.h"

namespace nax {

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// A gradient as the outer walk accumulates it: still unsummed over the mesh axes where the value
// is Invariant but the contributions vary (the outer pass psums it once, bucketed with the other
// gradients), unless parts already whole and parts still to sum met: those are finished here.
Tensor as_contribution(const autodiff::Pending& p) {
  return p.sums.size() == 1 && p.terms.empty() ? p.sums.begin()->second : autodiff::finish(p);
}

// What the forward ran, for the recompute to check that it runs the same function: the result's
// shape, dtype and bits, and the tensors read from outside the function.
struct FirstRun {
  Shape shape;
  DType dtype;
  std::optional<std::uint64_t> bits;
  std::vector<autodiff::ReadLog::Read> reads;
};

// A hash of the result's bytes where the host reads them (a recompute of the same function on the
// same inputs gives the same bits); on other devices only in checking mode (NAX_CHECK=1), since
// reading them there is a transfer.
std::optional<std::uint64_t> bits_of(const Tensor& y) {
  if (!y.device().host_accessible() && !checking_enabled()) return std::nullopt;
  return detail::content_hash64(y);
}

// d loss / d captured from d loss / d y: runs fn again, recording, and backpropagates g through
// the nodes it made (those made from `floor` on), stopping at the values from outside.
std::vector<Tensor> recompute_backward(const Fn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& captured,
                                       const FirstRun& first, const Tensor& g) {
  const std::uint64_t floor = autodiff::Node::next_sequence();
  Tensor y;
  {
    autodiff::EnableGrad recording;
    autodiff::ReadLog replay(&first.reads);
    y = fn(inputs);
    replay.finish();
  }
  if (!y.defined() || y.shape() != first.shape || y.dtype() != first.dtype)
    fail("remat", "the function gave {} when recomputed in backward but {}{} the first time: it must compute the same thing again",
         y.str(), dtype_name(first.dtype), first.shape.str());
  if (first.bits && bits_of(y) != first.bits)
    fail("remat", "the function gave other values when recomputed in backward than in the forward ({}): it depends on something "
         "that changed in between, such as a C++ variable it captured or a random seed drawn from a counter; random ops are pure "
         "functions of (seed, name), so derive seeds from values fixed before the forward (the step, the layer) and pass "
         "changing tensors as inputs", y.str());
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
  std::vector<autodiff::ReadLog::Read> reads;
  {
    autodiff::CaptureInputs capture;
    autodiff::ReadLog log;
    out = fn(inputs);
    captured = capture.inputs();
    reads = log.take();
  }
  if (!out.defined()) fail("remat", "the function returned an undefined tensor");
  if (captured.empty()) return out;
  FirstRun first{out.shape(), out.dtype(), bits_of(out), std::move(reads)};
  return autodiff::record("remat", out, captured, [fn, inputs, captured, first = std::move(first)](const Tensor& g) {
    return recompute_backward(fn, inputs, captured, first, g);
  });
}

Tensor remat(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  if (!fn) fail("remat", "the function is empty");
  return remat([fn](const std::vector<Tensor>& in) { return fn(in[0]); }, std::vector<Tensor>{x});
}

}  // namespace nax
