#pragma once
// Start/wait forms of all_gather, psum_scatter, psum and ppermute (docs/async-collectives.md):
// start_x(...) issues the collective and returns at once with a Pending whose wait() returns what
// x(...) would, so the caller can compute in between. The same checks, vary types and errors as
// the blocking forms; a start counts as the call, in the order started, so every device of the
// group must start (or call) the same collectives in the same order. Under grad, the backward of
// a started collective is its transpose started where the result was waited for and waited for
// where the collective was started.
//
// A Pending must be waited for exactly once: waiting twice is an error, and one destroyed
// without wait() (outside an exception) completes quietly and fails the device's program when it
// returns, naming the start and its call site.
#include <functional>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "nax/core/error.h"
#include "nax/core/names.h"
#include "nax/tensor/tensor.h"

namespace nax {

namespace detail {
// A Pending dropped unwaited: reported on the running shard when its program returns.
void report_unwaited(const std::string& what) noexcept;
}  // namespace detail

template <typename T>
class [[nodiscard]] Pending {
 public:
  Pending() = default;
  // `what` names the start for messages ("start_psum(f32[i=4] varying{mp}, mp) at f.cpp:12").
  Pending(std::string what, std::function<T()> complete) : what_(std::move(what)), complete_(std::move(complete)), state_(State::started) {}
  Pending(Pending&& o) noexcept : what_(std::move(o.what_)), complete_(std::move(o.complete_)), state_(std::exchange(o.state_, State::empty)) {}
  Pending& operator=(Pending&& o) noexcept {
    if (this != &o) {
      abandon();
      what_ = std::move(o.what_);
      complete_ = std::move(o.complete_);
      state_ = std::exchange(o.state_, State::empty);
    }
    return *this;
  }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending() { abandon(); }

  // The result, once: blocks until the collective has completed on this device.
  T wait() {
    if (state_ == State::waited) fail("wait", "{} was already waited for: wait() returns its result once", what_);
    if (state_ == State::empty) fail("wait", "this Pending holds no collective (default-made or moved from)");
    state_ = State::waited;
    return std::exchange(complete_, nullptr)();
  }
  bool started() const { return state_ == State::started; }
  const std::string& what() const { return what_; }

 private:
  enum class State { empty, started, waited };
  void abandon() noexcept {
    if (state_ != State::started) return;
    state_ = State::waited;
    try {
      std::exchange(complete_, nullptr)();  // the buffers outlive the transfer; the group's order holds
    } catch (...) {
    }
    detail::report_unwaited(what_);
  }

  std::string what_;
  std::function<T()> complete_;
  State state_ = State::empty;
};

// start_psum(x, m).wait() == psum(x, m), and so on for each.
Pending<Tensor> start_psum(const Tensor& x, const Names& mesh_axes, std::source_location where = std::source_location::current());
Pending<Tensor> start_all_gather(const Tensor& x, const Names& mesh_axes, const std::string& axis,
                                 std::source_location where = std::source_location::current());
// FSDP's prefetch: the next layer's parameters gathered while this one computes; backward, their
// gradients' terms are reduce-scattered while the layers before run theirs.
Pending<Tensor> start_all_gather_invariant(const Tensor& x, const Names& mesh_axes, const std::string& axis,
                                           std::source_location where = std::source_location::current());
Pending<Tensor> start_psum_scatter(const Tensor& x, const Names& mesh_axes, const std::string& axis,
                                   std::source_location where = std::source_location::current());
Pending<Tensor> start_ppermute(const Tensor& x, const Names& mesh_axes, const std::vector<std::pair<int, int>>& pairs,
                               std::source_location where = std::source_location::current());

}  // namespace nax
