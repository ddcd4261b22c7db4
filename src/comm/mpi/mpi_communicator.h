#pragma once
// The MPI communicator: one group of devices (one per process) over a set of mesh axes, ranked
// row-major over those axes like Mesh::group. Collectives are MPI's non-blocking ones, waited for
// by MpiWorld::wait (aborts, peers that finished, timeouts). Before each collective the group
// agrees on its signature (one all-reduce of two integers) unless the runtime's
// check_collectives is off: ranks that disagree raise the same error, naming both calls, on every
// rank of the group, as the local communicator does.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/mpi/mpi_comm_handle.h"
#include "comm/mpi/mpi_world.h"
#include "comm/signature.h"
#include "nax/comm/communicator.h"

namespace nax::mpi {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiWorld> world, const std::vector<std::string>& mesh_axes);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string describe() const override { return "mpi " + label_; }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void permute(const void* send, void* recv, std::size_t count, DType dtype,
               const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) override;
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call = {}) override;
  void barrier(const Call& call = {}) override;

  // MPI's own non-blocking collectives, posted after the signature check (which waits for the
  // group) and waited for by the request as the blocking forms wait.
  std::unique_ptr<Request> start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  std::unique_ptr<Request> start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  std::unique_ptr<Request> start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  std::unique_ptr<Request> start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                         const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) override;

 private:
  class MpiRequest;
  std::unique_ptr<Request> posted(std::vector<MPI_Request> requests, const CollectiveSignature& sig);
  // Records the call, checks that no device failed, and agrees on the signature with the group.
  void begin(CollectiveKind kind, std::size_t bytes, const CollectiveSignature& sig);
  // `agreed`: the group passed the signature check, so every member has posted its part.
  void wait(std::span<MPI_Request> requests, const CollectiveSignature& sig, bool agreed);
  std::string mismatch_message(const CollectiveSignature& sig);

  std::shared_ptr<MpiWorld> world_;
  std::string key_;    // "dp,mp"
  std::string label_;  // "group (dp,mp) of devices [0,1,2,3]"
  std::vector<int> members_;
  int rank_;
  CommHandle comm_;
  // The signature check's buffers, {h, -h} and the group's extremes: on the heap, so that they can
  // outlive a check abandoned by a timeout or an abort (MPI may still write them).
  std::unique_ptr<std::array<std::int64_t, 4>> agreement_ = std::make_unique<std::array<std::int64_t, 4>>();
};

}  // namespace nax::mpi
