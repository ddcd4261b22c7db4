#pragma once
// The thread communicator for devices whose memory the host cannot read (CUDA devices of one
// process, in particular several mesh devices sharing one GPU, which NCCL refuses). Ranks
// rendezvous in a LocalGroup as the host version does, then move data with their device's
// kernels: peers' slices are copied into this device's memory before they are reduced, so no
// kernel reads another GPU's memory. Each rank's stream is drained before it publishes its
// buffers and before it leaves, which orders the collective with the compute around it.
#include <memory>

#include "comm/local/local_world.h"
#include "nax/comm/communicator.h"
#include "nax/kernels/device.h"

namespace nax::local {

class DeviceCommunicator final : public Communicator {
 public:
  DeviceCommunicator(std::shared_ptr<LocalGroup> group, int rank, std::shared_ptr<Device> device)
      : group_(std::move(group)), rank_(rank), device_(std::move(device)) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string describe() const override { return "device-local " + group_->label(); }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void permute(const void* send, void* recv, std::size_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) override;
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call = {}) override;
  void barrier(const Call& call = {}) override;

 private:
  void join(const Signature& sig, const void* send, void* recv);  // drain the stream, publish, wait
  void leave();                                                    // drain the stream, wait for all
  // dst (this device) = the ranks' elements [offset, offset + count) of the send buffers, reduced
  // in rank order (every rank gets the same bits).
  void reduce_slice(void* dst, std::size_t offset, std::size_t count, DType dtype, ReduceOp op);

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::shared_ptr<Device> device_;
};

}  // namespace nax::local
