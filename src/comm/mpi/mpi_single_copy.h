#pragma once
// Collectives between processes of one host that read each other's buffers directly (Linux's
// cross-memory attach, process_vm_readv, which Open MPI itself uses for point-to-point), as the
// thread communicator reads its peers' buffers: each member reduces its block of the result,
// adding the members' parts in the halving tree (comm/rank_tree.h: the thread communicator's
// bits), then reads the others' finished blocks. Open MPI's own all-reduce and reduce-scatter copy
// every block through its transport and reach a third of that on one host.
//
// A member only ever reads another's memory, never writes it: a member that gives up on a call
// (an abort, a timeout) cannot have its memory changed by a peer that goes on. The group agrees
// once, when its communicator is made, whether every member is on this host and readable; each
// large call then needs the members' buffer addresses (the communicator's signature check gathers
// them) and ends with a barrier, after which no member reads another's buffers.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/rank_tree.h"
#include "nax/comm/communicator.h"

namespace nax::mpi {

class SingleCopy {
 public:
  // A member's buffers for one call, as addresses in its process.
  struct Buffers {
    std::uint64_t send = 0, recv = 0;
  };
  // Waits for MPI requests of the group as the communicator does (aborts, timeouts, peers gone).
  using Wait = std::function<void(std::span<MPI_Request>)>;

  // Collective over `comm`: null unless every member runs on this host, can read the others'
  // memory, and none has NAX_MPI_SINGLE_COPY=0.
  static std::unique_ptr<SingleCopy> probe(MPI_Comm comm, int rank, int size, const Wait& wait);

  // Calls that move at least this many bytes (an all-reduce's buffer, an all-gather's result, a
  // reduce-scatter's input) take the single-copy path; below it MPI's latency wins.
  static constexpr std::size_t kMinBytes = std::size_t{256} << 10;

  // `members`: every member's buffers for this call, in rank order.
  void all_reduce(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op, const Wait& wait);
  void reduce_scatter(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op, const Wait& wait);
  void all_gather(std::span<const Buffers> members, std::size_t count, DType dtype, const Wait& wait);

 private:
  SingleCopy(MPI_Comm comm, int rank, std::vector<std::int64_t> pids);

  void barrier(const Wait& wait);
  // Copies `bytes` at `address` in member q's memory (or this process's) to `local`.
  void read(int q, std::uint64_t address, void* local, std::size_t bytes) const;
  // Reduces elements [offset, offset + count) of the members' send buffers into `dst`, a
  // cache-sized chunk at a time, the members in the halving tree (comm/rank_tree.h).
  void reduce(std::span<const Buffers> members, std::size_t offset, std::size_t count, DType dtype, ReduceOp op, void* dst);

  MPI_Comm comm_;
  int rank_;
  std::vector<std::int64_t> pids_;
  comm::RankTreeScratch tree_;  // the reduction's partial results (the ranks added in the halving tree)
  std::vector<char> incoming_;  // a peer's chunk, read to be added
};

}  // namespace nax::mpi
