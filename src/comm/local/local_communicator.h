#pragma once
// The thread communicator: ranks are threads of one process. Every collective rendezvouses in a
// LocalGroup, where each rank publishes its buffer pointers, then reads its peers' buffers
// directly (no staging copy). Started collectives run in the order started on a worker thread of
// the communicator (CommWorker); a blocking one first waits for those, so that each rank's calls
// reach the group in one order.
#include <memory>

#include "comm/local/comm_worker.h"
#include "comm/local/local_world.h"
#include "nax/comm/communicator.h"

namespace nax::local {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string describe() const override { return "local " + group_->label(); }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void permute(const void* send, void* recv, std::size_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) override;
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call = {}) override;
  void barrier(const Call& call = {}) override;

  std::unique_ptr<Request> start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  std::unique_ptr<Request> start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  std::unique_ptr<Request> start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  std::unique_ptr<Request> start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                         const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) override;

 private:
  // The collectives' rendezvous and data movement, after record(); `on_worker`: run by the worker,
  // which the deadlock search does not follow (the device's own thread waits in wait()).
  void run_all_reduce(const Signature& sig, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, bool on_worker);
  void run_all_gather(const Signature& sig, const void* send, void* recv, std::size_t count, DType dtype, bool on_worker);
  void run_reduce_scatter(const Signature& sig, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, bool on_worker);
  void run_permute(const Signature& sig, const void* send, void* recv, std::size_t count, DType dtype,
                   const std::vector<std::pair<int, int>>& pairs, bool on_worker);
  // Queues `run(sig)` on the worker with its own copy of the origin (the caller's may be gone by then).
  std::unique_ptr<Request> started(const Signature& sig, std::function<void(const Signature&)> run);
  // Reduces the ranks' elements [offset, offset + count) of the send buffers into each of dsts.
  void reduce_block(const std::vector<void*>& dsts, std::size_t offset, std::size_t count, DType dtype, ReduceOp op);

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  CommWorker worker_;  // last: joined before the rest goes
};

}  // namespace nax::local
