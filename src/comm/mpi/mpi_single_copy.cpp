#include "comm/mpi/mpi_single_copy.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "comm/element_at.h"
#include "comm/mpi/mpi_session.h"
#include "comm/rank_tree.h"
#include "kernels/cpu/kernels.h"
#include "nax/core/error.h"

namespace nax::mpi {

namespace {

// The reduction adds one chunk of every member at a time: small enough to stay in the core's cache.
constexpr std::size_t kChunkBytes = std::size_t{64} << 10;

struct Identity {
  std::int64_t pid;
  std::uint64_t host;    // a hash of MPI_Get_processor_name
  std::uint64_t probe;   // the address of a word holding `pid`, for the others to read
  std::int64_t willing;  // 0: NAX_MPI_SINGLE_COPY=0
  std::int64_t arrivals_fd;  // the member's page of barrier counters (-1: none could be made)
};

constexpr std::size_t kArrivalsBytes = 4096;

// What the probe's collectives read and write: on the heap, left behind if a wait gives up.
struct ProbeBuffers {
  std::int64_t probe_word = 0;
  Identity own{};
  std::vector<Identity> members;
  std::int64_t verdict = 1;
};

std::uint64_t host_hash() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  check(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
  return std::hash<std::string_view>{}(std::string_view(name, static_cast<std::size_t>(length)));
}

// Copies `bytes` at `address` in process `pid` to `local`; false (errno set) when the kernel
// refuses or the memory is gone.
bool read_process(std::int64_t pid, std::uint64_t address, void* local, std::size_t bytes) {
  auto* at = static_cast<char*>(local);
  while (bytes > 0) {
    const iovec here{at, bytes};
    const iovec there{reinterpret_cast<void*>(address), bytes};
    const ssize_t moved = process_vm_readv(static_cast<pid_t>(pid), &here, 1, &there, 1, 0);
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) {
      if (moved == 0) errno = EFAULT;
      return false;
    }
    at += moved;
    address += static_cast<std::uint64_t>(moved);
    bytes -= static_cast<std::size_t>(moved);
  }
  return true;
}

const std::uint64_t* map_counter(std::int64_t pid, std::int64_t fd) {
  return static_cast<const std::uint64_t*>(shared_host_memory::map_peer_file(pid, fd, kArrivalsBytes));
}

bool readable(const Identity& member) {
  std::int64_t seen = 0;
  return read_process(member.pid, member.probe, &seen, sizeof seen) && seen == member.pid;
}

}  // namespace

bool SingleCopy::wanted() {
  const char* value = std::getenv("NAX_MPI_SINGLE_COPY");
  return value == nullptr || std::string_view(value) != "0";
}

bool SingleCopy::peers_can_map(MPI_Comm local) {
  int rank = 0, size = 1;
  MPI_Comm_rank(local, &rank);
  MPI_Comm_size(local, &size);
  const shared_host_memory::File page = shared_host_memory::make_file(kArrivalsBytes);
  const std::array<std::int64_t, 2> own{static_cast<std::int64_t>(getpid()), page.fd};
  std::vector<std::array<std::int64_t, 2>> all(static_cast<std::size_t>(size));
  check(MPI_Allgather(own.data(), sizeof own, MPI_BYTE, all.data(), sizeof own, MPI_BYTE, local), "MPI_Allgather");
  std::int64_t mappable = page.at != nullptr ? 1 : 0;
  for (int q = 0; q < size; ++q) {
    if (q == rank || all[static_cast<std::size_t>(q)][1] < 0) {
      if (q != rank) mappable = 0;
      continue;
    }
    const std::uint64_t* counter = map_counter(all[static_cast<std::size_t>(q)][0], all[static_cast<std::size_t>(q)][1]);
    if (counter == nullptr) mappable = 0;
    shared_host_memory::unmap_peer_file(counter, kArrivalsBytes);
  }
  // Every page stays until every process has tried it.
  check(MPI_Allreduce(MPI_IN_PLACE, &mappable, 1, MPI_INT64_T, MPI_MIN, local), "MPI_Allreduce");
  shared_host_memory::release_file(page, kArrivalsBytes);
  return mappable != 0;
}

std::unique_ptr<SingleCopy> SingleCopy::probe(MPI_Comm comm, int rank, int size, const Wait& wait) {
  auto buffers = std::make_unique<ProbeBuffers>();
  ProbeBuffers& b = *buffers;
  b.probe_word = static_cast<std::int64_t>(getpid());
  // Owns this member's page of counters and the peers' once mapped, whatever happens next.
  auto made = std::unique_ptr<SingleCopy>(
      new SingleCopy(rank, {}, shared_host_memory::make_file(kArrivalsBytes), std::vector<const std::uint64_t*>(static_cast<std::size_t>(size), nullptr)));
  b.own = {b.probe_word, host_hash(), reinterpret_cast<std::uint64_t>(&b.probe_word), wanted() ? 1 : 0, made->own_arrivals_.fd};
  b.members.resize(static_cast<std::size_t>(size));
  auto waited = [&](MPI_Request& request) {
    try {
      wait({&request, 1});
    } catch (...) {
      static_cast<void>(buffers.release());  // MPI may still read or write them
      throw;
    }
  };
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(&b.own, sizeof b.own, MPI_BYTE, b.members.data(), sizeof b.own, MPI_BYTE, comm, &request),
        "MPI_Iallgather");
  waited(request);
  for (int q = 0; q < size && b.verdict != 0; ++q) {
    const Identity& member = b.members[static_cast<std::size_t>(q)];
    if (member.host != b.own.host || member.willing == 0 || member.arrivals_fd < 0 || (q != rank && !readable(member))) b.verdict = 0;
    auto& counter = made->arrivals_[static_cast<std::size_t>(q)];
    counter = q == rank ? static_cast<const std::uint64_t*>(made->own_arrivals_.at) : map_counter(member.pid, member.arrivals_fd);
    if (counter == nullptr) b.verdict = 0;
  }
  // The probe words stay until every member has read them: the verdict needs every member's part.
  check(MPI_Iallreduce(MPI_IN_PLACE, &b.verdict, 1, MPI_INT64_T, MPI_MIN, comm, &request), "MPI_Iallreduce");
  waited(request);
  if (b.verdict == 0) return nullptr;
  for (const Identity& member : b.members) made->pids_.push_back(member.pid);
  return made;
}

SingleCopy::SingleCopy(int rank, std::vector<std::int64_t> pids, shared_host_memory::File own, std::vector<const std::uint64_t*> peers)
    : rank_(rank), pids_(std::move(pids)), own_arrivals_(own), arrivals_(std::move(peers)), incoming_(kChunkBytes) {}

SingleCopy::~SingleCopy() {
  for (const auto& [key, mapping] : mappings_) shared_host_memory::unmap_peer_file(mapping.at, mapping.bytes);
  for (std::size_t q = 0; q < arrivals_.size(); ++q)
    if (static_cast<int>(q) != rank_) shared_host_memory::unmap_peer_file(arrivals_[q], kArrivalsBytes);
  shared_host_memory::release_file(own_arrivals_, kArrivalsBytes);
}

SingleCopy::Buffers SingleCopy::own(const void* send, std::size_t send_bytes, const void* recv, std::size_t recv_bytes) {
  auto buffer = [](const void* at, std::size_t bytes) {
    return Buffer{reinterpret_cast<std::uint64_t>(at), shared_host_memory::segment_of(at, bytes).value_or(shared_host_memory::Segment{})};
  };
  return {buffer(send, send_bytes), buffer(recv, recv_bytes)};
}

const char* SingleCopy::mapped(int q, const shared_host_memory::Segment& block, std::uint64_t call) {
  const auto key = std::make_pair(q, block.serial);
  auto it = mappings_.find(key);
  if (it == mappings_.end()) {
    if (mappings_.size() >= kMappings) forget_least_used();
    // The owner holds the block (and its fd) until the call's last barrier: the fd is this block's.
    const auto* at = static_cast<const char*>(shared_host_memory::map_peer_file(pids_[static_cast<std::size_t>(q)], block.fd, block.bytes));
    it = mappings_.emplace(key, Mapping{at, block.bytes, 0}).first;
  }
  it->second.used = call;
  return it->second.at;
}

void SingleCopy::forget_least_used() {
  auto oldest = std::min_element(mappings_.begin(), mappings_.end(),
                                 [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
  shared_host_memory::unmap_peer_file(oldest->second.at, oldest->second.bytes);
  mappings_.erase(oldest);
}

std::vector<const char*> SingleCopy::in_place(std::span<const Buffers> members, Side which, std::uint64_t call) {
  std::vector<const char*> at(members.size(), nullptr);
  for (std::size_t q = 0; q < members.size(); ++q) {
    const Buffer& buffer = members[q].*which;
    if (static_cast<int>(q) == rank_) {
      at[q] = reinterpret_cast<const char*>(buffer.address);
    } else if (buffer.block.fd >= 0) {
      if (const char* base = mapped(static_cast<int>(q), buffer.block, call)) at[q] = base + (buffer.address - buffer.block.base);
    }
  }
  return at;
}

void SingleCopy::barrier(const Call& call, int phase) {
  const std::uint64_t reached = 2 * call.number + static_cast<std::uint64_t>(phase);
  __atomic_store_n(static_cast<std::uint64_t*>(own_arrivals_.at), reached, __ATOMIC_RELEASE);  // after this member's reads and writes
  call.poll([&] {
    return std::all_of(arrivals_.begin(), arrivals_.end(),
                       [&](const std::uint64_t* counter) { return __atomic_load_n(counter, __ATOMIC_ACQUIRE) >= reached; });
  });
}

void SingleCopy::read(int q, std::uint64_t address, const char* at, void* local, std::size_t bytes) const {
  if (at != nullptr) {
    std::memcpy(local, at, bytes);
    return;
  }
  const std::int64_t pid = pids_[static_cast<std::size_t>(q)];
  if (!read_process(pid, address, local, bytes))
    fail("mpi", "reading {} bytes of rank {}'s buffer (process {}) failed: {}", bytes, q, pid, std::strerror(errno));
}

void SingleCopy::reduce(std::span<const Buffers> members, std::size_t offset, std::size_t count, DType dtype, ReduceOp op,
                        void* dst, std::uint64_t call) {
  const std::vector<const char*> sends = in_place(members, &Buffers::send, call);
  const std::size_t es = dtype_size(dtype), per_chunk = kChunkBytes / es;
  for (std::size_t begin = 0; begin < count; begin += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - begin), bytes = n * es, at = (offset + begin) * es;
    const void* sum = comm::reduce_ranks_in_tree(static_cast<int>(members.size()), n, dtype, op, tree_, incoming_.data(),
                                                 [&](int q, void* into) -> const void* {
                                                   const char* here = sends[static_cast<std::size_t>(q)];
                                                   if (here != nullptr) return here + at;
                                                   read(q, members[static_cast<std::size_t>(q)].send.address + at, nullptr, into, bytes);
                                                   return into;
                                                 });
    std::memcpy(comm::element_at(dst, begin, dtype), sum, bytes);
  }
}

// Only member r reads or writes block r of anyone's buffers before the first barrier, and every
// member's block r is final after it: results may alias send buffers (an in-place all-reduce).
void SingleCopy::all_reduce(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op, const Call& call) {
  const std::size_t n = members.size(), r = static_cast<std::size_t>(rank_), es = dtype_size(dtype);
  auto begin_of = [&](std::size_t q) { return count * q / n; };
  void* recv = reinterpret_cast<void*>(members[r].recv.address);
  reduce(members, begin_of(r), begin_of(r + 1) - begin_of(r), dtype, op, comm::element_at(recv, begin_of(r), dtype), call.number);
  barrier(call, 1);
  const std::vector<const char*> results = in_place(members, &Buffers::recv, call.number);
  for (std::size_t q = 0; q < n; ++q) {
    if (q == r) continue;
    const std::size_t at = begin_of(q) * es;
    read(static_cast<int>(q), members[q].recv.address + at, results[q] != nullptr ? results[q] + at : nullptr,
         comm::element_at(recv, begin_of(q), dtype), (begin_of(q + 1) - begin_of(q)) * es);
  }
  barrier(call, 2);
}

void SingleCopy::reduce_scatter(std::span<const Buffers> members, std::size_t count, DType dtype, ReduceOp op, const Call& call) {
  const std::size_t r = static_cast<std::size_t>(rank_);
  reduce(members, count * r, count, dtype, op, reinterpret_cast<void*>(members[r].recv.address), call.number);
  barrier(call, 1);
}

void SingleCopy::all_gather(std::span<const Buffers> members, std::size_t count, DType dtype, const Call& call) {
  const std::size_t bytes = count * dtype_size(dtype);
  void* recv = reinterpret_cast<void*>(members[static_cast<std::size_t>(rank_)].recv.address);
  const std::vector<const char*> sends = in_place(members, &Buffers::send, call.number);
  for (std::size_t q = 0; q < members.size(); ++q)
    read(static_cast<int>(q), members[q].send.address, sends[q], comm::element_at(recv, count * q, dtype), bytes);
  barrier(call, 1);
}

}  // namespace nax::mpi
