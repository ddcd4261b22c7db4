#pragma once
// Collectives between processes of one host that read and write each other's buffers directly
// (Linux's cross-memory attach, process_vm_readv/writev, which Open MPI itself uses for
// point-to-point), as the thread communicator does with its peers' buffers: each member reduces
// its block of the result, adding the members' parts in rank order (the thread communicator's
// bits), and writes it straight into every member's result. Open MPI's own all-reduce and
// reduce-scatter copy every block through its transport and reach a third of that on one host.
//
// The group agrees once, when its communicator is made, whether every member is on this host and
// can be read and written; each large call then needs the members' buffer addresses (the
// communicator's signature check gathers them) and ends with a barrier, after which no member
// touches another's buffers.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

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

  // Collective over `comm`: null unless every member runs on this host, can reach the others'
  // memory, and none has NAX_MPI_SINGLE_COPY=0.
  static std::unique_ptr<SingleCopy> probe(MPI_Comm comm, int rank, int size, const Wait& wait);

  // Calls whose result has at least this many bytes take the single-copy path (below, MPI's
  // latency wins).
  static constexpr std::size_t kMinBytes = std::size_t{256} << 10;

  // `members`: every member's buffers for this call, in rank order.
  void all_reduce(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op);
  void reduce_scatter(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op);
  void all_gather(std::span<const Buffers> members, std::size_t count, DType dtype);

 private:
  SingleCopy(MPI_Comm comm, int rank, std::vector<std::int64_t> pids, Wait wait);

  void barrier();
  // Copies `bytes` between `address` in member q's memory (or this process's) and `local`.
  void read(int q, std::uint64_t address, void* local, std::size_t bytes) const;
  void write(int q, std::uint64_t address, const void* local, std::size_t bytes) const;
  // Reduces elements [offset, offset + count) of the members' send buffers, a cache-sized chunk at
  // a time, and hands each finished chunk (its first element's index past `offset`) to `deliver`.
  void reduce(std::span<const Buffers> members, std::size_t offset, std::size_t count, DType dtype, ReduceOp op,
              const std::function<void(std::size_t, const void*, std::size_t)>& deliver);

  MPI_Comm comm_;
  int rank_;
  std::vector<std::int64_t> pids_;
  Wait wait_;
  std::vector<char> chunk_, incoming_;  // the reduction's working buffers
};

}  // namespace nax::mpi
