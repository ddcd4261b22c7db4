#pragma once
// Large host blocks that other processes of this host can map: each one a memfd of its own, so
// that the MPI communicator's single-copy collectives (comm/mpi/mpi_single_copy.h) read a peer's
// tensors in place, with plain loads, as the thread communicator reads its peers' buffers, instead
// of copying them through the kernel. Off until the MPI runtime turns it on: a single process keeps
// its blocks on transparent huge pages (shared memory gets them only where the system allows).
#include <cstddef>
#include <cstdint>
#include <optional>

namespace nax::shared_host_memory {

// From now on, host blocks of at least kMinBytes are shared (blocks made before stay as they are),
// as many as half the file descriptors the process may open (the soft limit is raised to the hard).
void enable();
bool enabled();

constexpr std::size_t kMinBytes = std::size_t{256} << 10;

// A block another process can map: open /proc/<pid>/fd/<fd>, map `bytes`, and find an address at
// `address - base`. `serial` names the block for as long as this process lives (fd numbers are
// reused once a block is freed).
struct Segment {
  std::int64_t fd = -1;
  std::uint64_t serial = 0;
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
};

// The shared block holding [ptr, ptr + bytes), if there is one.
std::optional<Segment> segment_of(const void* ptr, std::size_t bytes);

// A memfd of `bytes`, mapped read-write in this process ({-1, nullptr} when the system refuses
// one), and its release.
struct File {
  int fd = -1;
  void* at = nullptr;
};
File make_file(std::size_t bytes);
void release_file(const File& file, std::size_t bytes);

// Process `pid`'s file `fd` (from make_file there), mapped read-only here; nullptr when it cannot
// be (gone, too short, or the system forbids it). Unmap it with unmap_peer_file.
const void* map_peer_file(std::int64_t pid, std::int64_t fd, std::size_t bytes);
void unmap_peer_file(const void* at, std::size_t bytes);

// A new shared block (nullptr when sharing is off, the block is small, or the system refuses one:
// the caller then allocates as usual); free returns false for a pointer it did not make.
void* allocate(std::size_t bytes);
bool free(void* ptr);

}  // namespace nax::shared_host_memory
