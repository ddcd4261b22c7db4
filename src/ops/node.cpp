// The tape every op records on: grad mode, parameters, stop_gradient and record (node.h). The
// backward pass that walks it is the autodiff layer's (src/autodiff/autodiff.cpp).
#include "ops/node.h"

#include <atomic>

#include "nax/core/error.h"

namespace nax {

namespace {
thread_local bool g_grad_enabled = true;
thread_local autodiff::CaptureInputs* g_capture = nullptr;
thread_local bool g_transposing = false;
thread_local autodiff::OutsideReads* g_outside_reads = nullptr;
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGrad::NoGrad() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGrad::~NoGrad() { g_grad_enabled = previous_; }

Tensor parameter(const Tensor& x) {
  if (!x.defined()) fail("parameter", "the tensor is undefined");
  auto node = std::make_shared<autodiff::Node>();
  node->op = "parameter";
  node->leaf = true;
  return x.with_grad_node(std::move(node));
}

Tensor stop_gradient(const Tensor& x) { return x.requires_grad() ? x.with_grad_node(nullptr) : x; }

namespace autodiff {

std::uint64_t Node::next_sequence() {
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

CaptureInputs::CaptureInputs() : previous_grad_(g_grad_enabled), previous_(g_capture) {
  g_grad_enabled = false;
  g_capture = this;
}

CaptureInputs::~CaptureInputs() {
  g_grad_enabled = previous_grad_;
  g_capture = previous_;
}

void CaptureInputs::see(const Tensor& t) {
  if (t.defined() && t.requires_grad() && seen_.insert(t.grad_node().get()).second) inputs_.push_back(t);
}

EnableGrad::EnableGrad() : previous_(g_grad_enabled), previous_capture_(g_capture), previous_transposing_(g_transposing) {
  g_grad_enabled = true;
  g_capture = nullptr;
  g_transposing = false;
}

EnableGrad::~EnableGrad() {
  g_grad_enabled = previous_;
  g_capture = previous_capture_;
  g_transposing = previous_transposing_;
}

OutsideReads::OutsideReads(const std::vector<std::uint64_t>* expected)
    : first_(Tensor::next_storage_id()), previous_(g_outside_reads), expected_(expected) {
  g_outside_reads = this;
}

OutsideReads::~OutsideReads() { g_outside_reads = previous_; }

void OutsideReads::see(const Tensor& t, std::string_view op) {
  const std::uint64_t id = t.storage_id();
  if (id >= first_) return;  // made inside
  if (expected_ == nullptr) {
    reads_.push_back(id);
    return;
  }
  if (next_ < expected_->size() && (*expected_)[next_] == id) {
    ++next_;
    return;
  }
  fail("remat", "when recomputed in backward, the function's op '{}' read {} from outside the function, {}: a function under "
       "remat must read the same tensors again; pass the tensors it reads as inputs (remat(fn, {{x, ...}})) or capture them by "
       "value, not through a variable that changes before the backward", op, t.str(),
       next_ < expected_->size() ? "a tensor other than the one it read in the forward (was a captured variable reassigned?)"
                                 : "which it did not read in the forward");
}

void OutsideReads::finish() const {
  if (expected_ != nullptr && next_ != expected_->size())
    fail("remat", "when recomputed in backward, the function read {} of the {} tensors from outside it that it read in the forward: "
         "a function under remat must compute the same thing again (does it branch on something that changed?)", next_,
         expected_->size());
}

void note_read(const Tensor& t, std::string_view op) {
  for (OutsideReads* r = g_outside_reads; r != nullptr; r = r->previous_) r->see(t, op);
}

Transposing::Transposing() : previous_(g_transposing) { g_transposing = true; }
Transposing::~Transposing() { g_transposing = previous_; }
bool transposing() { return g_transposing; }

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (g_capture != nullptr)
    for (const Tensor* t : inputs) g_capture->see(*t);
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

Tensor record(std::string op, const Tensor& out, std::vector<Tensor> inputs, BackwardFn backward) {
  if (g_capture != nullptr)
    for (const auto& t : inputs) g_capture->see(t);
  if (!g_grad_enabled) return out;
  bool needed = false;
  for (auto& t : inputs) {
    if (t.defined() && t.requires_grad()) needed = true;
    else t = Tensor();  // keep nothing alive for an input that takes no gradient
  }
  if (!needed) return out;
  out.mark_read();  // the backward may read it (an op saves its output): immutable from here
  auto node = std::make_shared<Node>();
  node->op = std::move(op);
  node->inputs = std::move(inputs);
  node->backward = std::move(backward);
  return out.with_grad_node(std::move(node));
}
}  // namespace autodiff
}  // namespace nax
