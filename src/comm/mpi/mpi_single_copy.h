#pragma once
// Collectives between processes of one host that read each other's buffers directly, as the thread
// communicator reads its peers' buffers: each member reduces its block of the result, adding the
// members' parts in the halving tree (comm/rank_tree.h: the thread communicator's bits), then
// reads the others' finished blocks. A peer's buffer in a shared host block (core/
// shared_host_memory.h: large tensors, once MPI runs on one host) is mapped once and read in
// place with plain loads; any other buffer is copied through the kernel (Linux's cross-memory
// attach, process_vm_readv, which Open MPI itself uses for point-to-point). Open MPI's own
// all-reduce and reduce-scatter copy every block through its transport and reach a third of that.
//
// A member only ever reads another's memory, never writes it (the mappings are read-only): a
// member that gives up on a call (an abort, a timeout) cannot have its memory changed by a peer
// that goes on. The group agrees once, when its communicator is made, whether every member is on
// this host and readable; each large call then needs the members' buffers (the communicator's
// signature check gathers them) and ends with a barrier, after which no member reads another's
// buffers. A barrier is a counter each member raises in a page of its own that the others map
// and watch: a member arrives with one store, where MPI's barrier needs every process scheduled
// in turn to pass its messages on (slow when the host runs more processes than it has cores).
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "comm/rank_tree.h"
#include "core/shared_host_memory.h"
#include "nax/comm/communicator.h"

namespace nax::mpi {

class SingleCopy {
 public:
  SingleCopy(const SingleCopy&) = delete;
  SingleCopy& operator=(const SingleCopy&) = delete;
  ~SingleCopy();  // unmaps the peers' blocks

  // A member's buffer, as an address in its process and the shared block holding it (fd -1: none).
  struct Buffer {
    std::uint64_t address = 0;
    shared_host_memory::Segment block;
  };
  // A member's buffers for one call.
  struct Buffers {
    Buffer send, recv;
  };
  // This process's buffers of `send_bytes` and `recv_bytes`, as the others will read them.
  static Buffers own(const void* send, std::size_t send_bytes, const void* recv, std::size_t recv_bytes);
  // Waits for MPI requests of the group as the communicator does (aborts, timeouts, peers gone).
  using Wait = std::function<void(std::span<MPI_Request>)>;
  // Polls a condition until it holds, with the same checks.
  using Poll = std::function<void(const std::function<bool()>&)>;

  // False under NAX_MPI_SINGLE_COPY=0.
  static bool wanted();
  // Whether every process of `local` (one host's) can map every other one's files: collective.
  static bool peers_can_map(MPI_Comm local);

  // Collective over `comm`: null unless every member runs on this host, can read the others'
  // memory, and none has NAX_MPI_SINGLE_COPY=0.
  static std::unique_ptr<SingleCopy> probe(MPI_Comm comm, int rank, int size, const Wait& wait);

  // Calls that move at least this many bytes (an all-reduce's buffer, an all-gather's result, a
  // reduce-scatter's input) take the single-copy path; below it MPI's latency wins.
  static constexpr std::size_t kMinBytes = std::size_t{256} << 10;

  // `members`: every member's buffers for this call, in rank order; `call`: the call's number on
  // the group, the same on every member (the communicator's count of its calls), from which the
  // barriers' counts are made, so that a call abandoned half-way (an abort) leaves no member's
  // count ahead of the next call's.
  struct Call {
    std::uint64_t number;
    const Poll& poll;
  };
  void all_reduce(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op, const Call& call);
  void reduce_scatter(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op, const Call& call);
  void all_gather(std::span<const Buffers> members, std::size_t count, DType dtype, const Call& call);

 private:
  SingleCopy(int rank, std::vector<std::int64_t> pids, shared_host_memory::File own, std::vector<const std::uint64_t*> peers);

  // Where each member's buffer (`which` of its Buffers) can be read in place in this process, or
  // nullptr where it must be copied through the kernel; `call` (the call's number) marks the
  // mappings it uses as the most recent.
  using Side = Buffer Buffers::*;
  std::vector<const char*> in_place(std::span<const Buffers> members, Side which, std::uint64_t call);
  // Member q's shared block, mapped read-only here (nullptr when it cannot be).
  const char* mapped(int q, const shared_host_memory::Segment& block, std::uint64_t call);

  // Every member has reached barrier `phase` (1, 2) of the call: all of its reads and writes before
  // it are done.
  void barrier(const Call& call, int phase);
  // Copies `bytes` at `address` in member q's memory to `local`, from `at` (its place here) when
  // not null.
  void read(int q, std::uint64_t address, const char* at, void* local, std::size_t bytes) const;
  // Reduces elements [offset, offset + count) of the members' send buffers into `dst`, a
  // cache-sized chunk at a time, the members in the halving tree (comm/rank_tree.h).
  void reduce(std::span<const Buffers> members, std::size_t offset, std::size_t count, DType dtype, ReduceOp op, void* dst,
              std::uint64_t call);

  struct Mapping {
    const char* at = nullptr;  // nullptr: the block could not be mapped (it is copied instead)
    std::size_t bytes = 0;
    std::uint64_t used = 0;  // the number of the call that last read it
  };
  // The peers' shared blocks mapped so far, by (member, block serial); the least recently used
  // go beyond kMappings (a block its owner has freed stays alive while it is mapped here).
  static constexpr std::size_t kMappings = 256;
  void forget_least_used();

  int rank_;
  std::vector<std::int64_t> pids_;
  shared_host_memory::File own_arrivals_;  // this member's page of barrier counters, which the others map
  std::vector<const std::uint64_t*> arrivals_;  // every member's counter, mapped here (this member's too)
  std::map<std::pair<int, std::uint64_t>, Mapping> mappings_;
  comm::RankTreeScratch tree_;  // the reduction's partial results (the ranks added in the halving tree)
  std::vector<char> incoming_;  // a peer's chunk, read to be added
};

}  // namespace nax::mpi
