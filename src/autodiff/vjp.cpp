// vjp: a forward now, its backward later (nax/autodiff/autodiff.h). The outputs hang from one
// node whose backward hands each output its cotangent, so the pullback is one walk from that node.
#include <memory>
#include <unordered_set>
#include <utility>

#include "autodiff/backward.h"
#include "nax/autodiff/autodiff.h"
#include "nax/core/error.h"
#include "nax/ops/ops.h"

namespace nax {

namespace {

// A cotangent of `output`: same axes and sizes (any order), a floating dtype; undefined means zero.
void check_cotangent(const Tensor& ct, const Tensor& output, std::size_t i) {
  if (!ct.defined()) return;
  if (!ct.shape().same_axes(output.shape()))
    fail("vjp", "cotangents[{}] = {} does not match output {} (same axes and sizes, any order)", i, ct.str(), output.str());
  if (!is_floating(ct.dtype())) fail("vjp", "cotangents[{}] = {} is not a floating-point tensor", i, ct.str());
}

// What the pullback needs, kept from the forward until it runs.
struct Tape {
  std::vector<Tensor> leaves;   // the primals as fresh leaves
  std::vector<Tensor> outputs;  // as fn returned them, carrying their nodes
  std::uint64_t floor = 0;      // the first node fn's ops made
  bool used = false;
};

std::vector<Tensor> pull_back(Tape& tape, const std::vector<Tensor>& cotangents) {
  if (tape.used) fail("vjp", "this pullback was already called: each vjp's backward runs once");
  if (cotangents.size() != tape.outputs.size())
    fail("vjp", "the pullback takes one cotangent per output: {} outputs, {} cotangents", tape.outputs.size(), cotangents.size());
  std::vector<Tensor> recorded, seeds;
  for (std::size_t i = 0; i < tape.outputs.size(); ++i) {
    check_cotangent(cotangents[i], tape.outputs[i], i);
    if (cotangents[i].defined() && tape.outputs[i].requires_grad()) recorded.push_back(tape.outputs[i]), seeds.push_back(cotangents[i]);
  }
  tape.used = true;  // a refused call above leaves the pullback to be called again
  std::vector<Tensor> leaves = std::exchange(tape.leaves, {});
  tape.outputs.clear();
  if (recorded.empty()) return autodiff::gradients_of({}, leaves);
  std::unordered_set<autodiff::Node*> wanted;
  for (const auto& leaf : leaves) wanted.insert(leaf.grad_node().get());
  Tensor root;
  {
    autodiff::EnableGrad recording;
    root = autodiff::record("vjp", zeros(Shape{}), recorded, [seeds](const Tensor&) { return seeds; });
  }
  NoGrad no_grad;  // backward computations are not recorded
  auto grads = autodiff::backpropagate(root, zeros(Shape{}), wanted, tape.floor);
  for (const auto& [node, pending] : grads)
    if (!wanted.count(node) && node->sequence < tape.floor)
      fail("vjp", "the function read {}, which needs a gradient, from outside its primals: pass it as a primal (or "
           "stop_gradient it)", pending.like.str());
  return autodiff::gradients_of(std::move(grads), leaves);
}

}  // namespace

Vjp vjp(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& primals) {
  if (!fn) fail("vjp", "the function is empty");
  if (!grad_enabled()) fail("vjp", "called under NoGrad: nothing would be recorded for the pullback");
  auto tape = std::make_shared<Tape>();
  tape->floor = autodiff::Node::next_sequence();
  for (std::size_t i = 0; i < primals.size(); ++i) {
    if (!primals[i].defined()) fail("vjp", "primals[{}] is undefined", i);
    tape->leaves.push_back(parameter(stop_gradient(primals[i])));
  }
  tape->outputs = fn(tape->leaves);
  Vjp out;
  for (std::size_t i = 0; i < tape->outputs.size(); ++i) {
    if (!tape->outputs[i].defined()) fail("vjp", "the function returned an undefined tensor as output {}", i);
    out.outputs.push_back(stop_gradient(tape->outputs[i]));
  }
  out.pullback = [tape](const std::vector<Tensor>& cotangents) { return pull_back(*tape, cotangents); };
  return out;
}

}  // namespace nax
