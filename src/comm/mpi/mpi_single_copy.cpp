#include "comm/mpi/mpi_single_copy.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "comm/element_at.h"
#include "comm/mpi/mpi_session.h"
#include "kernels/cpu/kernels.h"
#include "nax/core/error.h"

namespace nax::mpi {

namespace {

// The reduction adds one chunk of every member at a time: small enough to stay in the core's cache.
constexpr std::size_t kChunkBytes = std::size_t{64} << 10;

struct Identity {
  std::int64_t pid;
  std::uint64_t host;    // a hash of MPI_Get_processor_name
  std::uint64_t probe;   // the address of a word holding `pid`, for the others to read and write
  std::int64_t willing;  // 0: NAX_MPI_SINGLE_COPY=0
};

std::uint64_t host_hash() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  check(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
  return std::hash<std::string_view>{}(std::string_view(name, static_cast<std::size_t>(length)));
}

bool willing() {
  const char* value = std::getenv("NAX_MPI_SINGLE_COPY");
  return value == nullptr || std::string_view(value) != "0";
}

// Moves `bytes` between `local` and `address` in process `pid` (to it when `out`); false when the
// kernel refuses or the memory is gone.
bool cross(std::int64_t pid, std::uint64_t address, void* local, std::size_t bytes, bool out) {
  auto* at = static_cast<char*>(local);
  while (bytes > 0) {
    const iovec here{at, bytes};
    const iovec there{reinterpret_cast<void*>(address), bytes};
    const ssize_t moved = out ? process_vm_writev(static_cast<pid_t>(pid), &here, 1, &there, 1, 0)
                              : process_vm_readv(static_cast<pid_t>(pid), &here, 1, &there, 1, 0);
    if (moved <= 0) {
      if (moved < 0 && errno == EINTR) continue;
      return false;
    }
    at += moved;
    address += static_cast<std::uint64_t>(moved);
    bytes -= static_cast<std::size_t>(moved);
  }
  return true;
}

// Reads member `peer`'s probe word and writes the same value back.
bool reachable(const Identity& peer) {
  std::int64_t seen = 0;
  return cross(peer.pid, peer.probe, &seen, sizeof seen, false) && seen == peer.pid && cross(peer.pid, peer.probe, &seen, sizeof seen, true);
}

}  // namespace

std::unique_ptr<SingleCopy> SingleCopy::probe(MPI_Comm comm, int rank, int size, const Wait& wait) {
  // The probe word lives until the group's verdict is in, so every member finds it.
  const auto own_pid = static_cast<std::int64_t>(getpid());
  std::int64_t probe_word = own_pid;
  const Identity own{own_pid, host_hash(), reinterpret_cast<std::uint64_t>(&probe_word), willing() ? 1 : 0};
  auto identities = std::make_unique<std::vector<Identity>>(static_cast<std::size_t>(size));
  auto verdict = std::make_unique<std::int64_t>(1);
  // What MPI may still write stays behind if a wait gives up (an abort, a timeout).
  auto waited = [&](MPI_Request& request) {
    try {
      wait({&request, 1});
    } catch (...) {
      static_cast<void>(identities.release());
      static_cast<void>(verdict.release());
      throw;
    }
  };
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(&own, sizeof own, MPI_BYTE, identities->data(), sizeof own, MPI_BYTE, comm, &request), "MPI_Iallgather");
  waited(request);
  for (const Identity& peer : *identities) {
    if (peer.host != own.host || peer.willing == 0 || (peer.pid != own_pid && !reachable(peer))) *verdict = 0;
    if (*verdict == 0) break;
  }
  check(MPI_Iallreduce(MPI_IN_PLACE, verdict.get(), 1, MPI_INT64_T, MPI_MIN, comm, &request), "MPI_Iallreduce");
  waited(request);
  if (*verdict == 0) return nullptr;

  std::vector<std::int64_t> pids;
  for (const Identity& peer : *identities) pids.push_back(peer.pid);
  return std::unique_ptr<SingleCopy>(new SingleCopy(comm, rank, std::move(pids), wait));
}

SingleCopy::SingleCopy(MPI_Comm comm, int rank, std::vector<std::int64_t> pids, Wait wait)
    : comm_(comm), rank_(rank), pids_(std::move(pids)), wait_(std::move(wait)), chunk_(kChunkBytes), incoming_(kChunkBytes) {}

void SingleCopy::barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  wait_({&request, 1});
}

void SingleCopy::read(int q, std::uint64_t address, void* local, std::size_t bytes) const {
  if (q == rank_) {
    std::memmove(local, reinterpret_cast<const void*>(address), bytes);  // an in-place all_gather's own block
    return;
  }
  const std::int64_t pid = pids_[static_cast<std::size_t>(q)];
  if (!cross(pid, address, local, bytes, false))
    fail("mpi", "reading {} bytes of rank {}'s buffer (process {}) failed: {}", bytes, q, pid, std::strerror(errno));
}

void SingleCopy::write(int q, std::uint64_t address, const void* local, std::size_t bytes) const {
  if (q == rank_) {
    std::memcpy(reinterpret_cast<void*>(address), local, bytes);
    return;
  }
  const std::int64_t pid = pids_[static_cast<std::size_t>(q)];
  if (!cross(pid, address, const_cast<void*>(local), bytes, true))
    fail("mpi", "writing {} bytes into rank {}'s buffer (process {}) failed: {}", bytes, q, pid, std::strerror(errno));
}

void SingleCopy::reduce(std::span<const Buffers> members, std::size_t offset, std::size_t count, DType dtype, ReduceOp op,
                        const std::function<void(std::size_t, const void*, std::size_t)>& deliver) {
  const std::size_t es = dtype_size(dtype), per_chunk = kChunkBytes / es;
  for (std::size_t begin = 0; begin < count; begin += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - begin), bytes = n * es, at = (offset + begin) * es;
    read(0, members[0].send + at, chunk_.data(), bytes);
    for (int q = 1; q < static_cast<int>(members.size()); ++q) {
      const std::uint64_t part = members[static_cast<std::size_t>(q)].send + at;
      if (q == rank_) {
        cpu::accumulate(op, dtype, chunk_.data(), reinterpret_cast<const void*>(part), n);
      } else {
        read(q, part, incoming_.data(), bytes);
        cpu::accumulate(op, dtype, chunk_.data(), incoming_.data(), n);
      }
    }
    deliver(begin, chunk_.data(), bytes);
  }
}

void SingleCopy::all_reduce(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op) {
  const std::size_t n = members.size(), r = static_cast<std::size_t>(rank_), es = dtype_size(dtype);
  const std::size_t begin = count * r / n, end = count * (r + 1) / n;
  // Every member's chunk is read before any member's result is written, and only this member
  // reads block r, so results may alias send buffers.
  reduce(members, begin, end - begin, dtype, op, [&](std::size_t at, const void* chunk, std::size_t bytes) {
    for (std::size_t q = 0; q < n; ++q) write(static_cast<int>(q), members[q].recv + (begin + at) * es, chunk, bytes);
  });
  barrier();
}

void SingleCopy::reduce_scatter(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op) {
  const std::size_t r = static_cast<std::size_t>(rank_), es = dtype_size(dtype);
  reduce(members, count * r, count, dtype, op, [&](std::size_t at, const void* chunk, std::size_t bytes) {
    std::memcpy(reinterpret_cast<char*>(members[r].recv) + at * es, chunk, bytes);
  });
  barrier();
}

void SingleCopy::all_gather(std::span<const Buffers> members, std::size_t count, DType dtype) {
  const std::size_t bytes = count * dtype_size(dtype);
  void* recv = reinterpret_cast<void*>(members[static_cast<std::size_t>(rank_)].recv);
  for (std::size_t q = 0; q < members.size(); ++q) read(static_cast<int>(q), members[q].send, comm::element_at(recv, count * q, dtype), bytes);
  barrier();
}

}  // namespace nax::mpi
