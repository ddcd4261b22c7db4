#pragma once
// How a named collective makes its communicator call: blocking, or started (the request and the
// rest of the op kept until a Pending's wait). The collectives' forward functions take a Launch,
// so the blocking and the start forms share their checks, vary rules and packing.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nax/comm/communicator.h"
#include "nax/tensor/tensor.h"

namespace nax::detail {

class Launch {
 public:
  static Launch blocking() { return Launch({}); }
  // `label` names the start form the user called ("start_psum(...) at f.cpp:12:7"): the started
  // call's communicator carries it, so that a mismatch names it rather than the blocking form.
  static Launch started(std::string label) { return Launch(std::move(label)); }
  Launch(Launch&&) = default;
  Launch& operator=(Launch&&) = default;
  // A started call that is never completed (an error on the way) releases its buffers' marks.
  ~Launch();

  // The communicator's calls, made with `call` (the named collective's text and site): a started
  // one is named by the start form's label instead, at the same site.
  void all_reduce(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call);
  void all_reduce_parts(Communicator& c, const std::vector<const void*>& parts, void* recv, std::size_t count, DType dtype, ReduceOp op,
                        const Call& call);
  void all_gather(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype, const Call& call);
  void reduce_scatter(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call);
  void permute(Communicator& c, const void* send, void* recv, std::size_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs, const Call& call);
  // Buffers a started call reads or writes: alive until it completes, and marked pending until
  // then, so that a write to one (Tensor::mutable_data) is an error naming the collective.
  void keep(const std::vector<Tensor>& buffers);

  // The op's result, made by `finish` from the received data: at once when the call was blocking
  // (or nothing was sent); else an undefined Tensor, and complete() makes it later.
  Tensor then(std::function<Tensor()> finish);
  bool in_flight() const { return request_ != nullptr; }
  // A started call's number on this thread, in the trace's slices of its start and its completion
  // ("ticket"), which pair them (the replay of a timeline reads them); 0 for a blocking call.
  std::uint64_t ticket() const { return ticket_; }
  // An all-reduce that writes its result over its input (autodiff's gradient buckets, a buffer no
  // one else holds): the op returns the input's storage, summed, instead of a fresh tensor.
  void write_over_input() { over_input_ = true; }
  bool over_input() const { return over_input_; }
  // Waits for the started call and finishes the op.
  Tensor complete();

 private:
  explicit Launch(std::string label);
  bool start() const { return !label_.empty(); }
  void started();  // marks the kept buffers pending under the label
  void release();  // clears those marks (the buffers stay kept)
  std::string label_;  // empty for a blocking call
  std::uint64_t ticket_ = 0;
  bool over_input_ = false;
  std::vector<Tensor> kept_;
  std::function<Tensor()> finish_;
  std::unique_ptr<Communicator::Request> request_;  // last: destroyed (so waited for) before the buffers
};

}  // namespace nax::detail
