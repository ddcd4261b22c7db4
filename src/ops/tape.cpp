// The tape every op records on: grad mode, parameters, stop_gradient and record (node.h). The
// backward pass that walks it is the autodiff layer's (src/autodiff/autodiff.cpp).
#include "ops/tape.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "nax/core/error.h"

namespace nax {

namespace {
thread_local bool g_grad_enabled = true;
thread_local autodiff::CaptureInputs* g_capture = nullptr;
thread_local bool g_transposing = false;
thread_local autodiff::ReadLog* g_read_log = nullptr;
thread_local int g_no_grad_depth = 0;  // NoGrad scopes open on this thread
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGrad::NoGrad() : previous_(g_grad_enabled) {
  g_grad_enabled = false;
  ++g_no_grad_depth;
}
NoGrad::~NoGrad() {
  g_grad_enabled = previous_;
  --g_no_grad_depth;
}

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

ReadLog::ReadLog(const std::vector<Read>* expected)
    : first_(Tensor::next_storage_id()), no_grad_(g_no_grad_depth), previous_(g_read_log), expected_(expected) {
  g_read_log = this;
}

ReadLog::~ReadLog() { g_read_log = previous_; }

namespace {

// What differs between the forward's read and the recompute's, for the message.
std::string what_changed(const ReadLog::Read& was, const ReadLog::Read& now) {
  if (was.storage != now.storage)
    return now.storage == 0 ? "a tensor made inside the function where the forward read one from outside"
           : was.storage == 0 ? "a tensor from outside the function where the forward read one made inside"
                              : "a tensor from outside other than the one the forward read (was a captured variable reassigned?)";
  if (was.needs_gradient != now.needs_gradient || was.no_grad != now.no_grad)
    return "the same tensor, but its gradient goes another way than in the forward (a stop_gradient or NoGrad decided by "
           "something that changed)";
  return "other values than in the forward: the function depends on something that changed in between, such as a C++ value "
         "it captured or a random seed drawn from a counter (random ops are pure functions of (seed, name): derive seeds from "
         "values fixed before the forward)";
}

}  // namespace

void ReadLog::see(const Tensor& t, std::uint64_t sample, std::string_view op) {
  const bool outside = t.storage_id() < first_;
  const Read now{outside ? t.storage_id() : 0, sample, g_no_grad_depth - no_grad_, outside && t.requires_grad()};
  if (expected_ == nullptr) {
    reads_.push_back(now);
    return;
  }
  if (next_ < expected_->size() && (*expected_)[next_] == now) {
    ++next_;
    return;
  }
  fail("remat", "when recomputed in backward, the function's op '{}' read {}: {}. A function under remat must compute the same "
       "thing again: pass the tensors it reads as inputs (remat(fn, {{x, ...}})) or capture them by value",
       op, t.str(), next_ < expected_->size() ? what_changed((*expected_)[next_], now) : "a read the forward did not make");
}

void ReadLog::finish() const {
  if (expected_ != nullptr && next_ != expected_->size())
    fail("remat", "when recomputed in backward, the function made {} of the {} reads it made in the forward: a function under "
         "remat must compute the same thing again (does it branch on something that changed?)", next_, expected_->size());
}

namespace {

// A few bytes of t (its first and last 32, and its size) where the host reads them: enough to
// tell a recompute that read other values, at no cost that shows.
std::uint64_t sample_of(const Tensor& t) {
  std::uint64_t h = static_cast<std::uint64_t>(t.numel()) * 0x9E3779B97F4A7C15ull;
  if (!t.has_data() || !t.device().host_accessible() || t.nbytes() == 0) return h;  // a description: its shape is what is read
  const auto* bytes = static_cast<const unsigned char*>(t.raw());
  const std::size_t n = t.nbytes(), k = std::min<std::size_t>(n, 32);
  auto mix = [&](std::size_t at) {
    std::uint64_t w = 0;
    std::memcpy(&w, bytes + at, std::min<std::size_t>(8, n - at));
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  };
  for (std::size_t i = 0; i < k; i += 8) mix(i);
  for (std::size_t i = n - k; i < n; i += 8) mix(i);
  return h;
}

}  // namespace

void note_read(const Tensor& t, std::string_view op) {
  if (g_read_log == nullptr) return;
  const std::uint64_t sample = sample_of(t);
  for (ReadLog* r = g_read_log; r != nullptr; r = r->previous_) r->see(t, sample, op);
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
    // The graph keeps an input's description and node, not its data: what the backward reads, it
    // captured; the rest is freed when its last reader lets go, as PyTorch's saved tensors are.
    if (t.defined() && t.requires_grad()) t = t.without_data(), needed = true;
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
