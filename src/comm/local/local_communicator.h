#pragma once
// The thread communicator: ranks are threads of one process. Every collective rendezvouses in a
// LocalGroup, where each rank publishes its buffer pointers, then reads its peers' buffers
// directly (no staging copy).
#include <memory>

#include "comm/local/local_world.h"
#include "nax/comm/communicator.h"

namespace nax::local {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string describe() const override { return "local " + group_->label(); }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override;
  void permute(const void* send, void* recv, std::size_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs) override;
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root) override;
  void barrier() override;

 private:
  Signature signature(CollectiveKind kind, DType dtype, std::size_t count, int detail = 0, std::uint64_t pairs_hash = 0) const;
  // Reduces the ranks' elements [offset, offset + count) of the send buffers into each of dsts.
  void reduce_block(const std::vector<void*>& dsts, std::size_t offset, std::size_t count, DType dtype, ReduceOp op);

  std::shared_ptr<LocalGroup> group_;
  int rank_;
};

}  // namespace nax::local
