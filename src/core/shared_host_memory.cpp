#include "core/shared_host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

namespace nax::shared_host_memory {

namespace {

std::atomic<bool> sharing{false};

struct Block {
  int fd;
  std::uint64_t serial;
  std::size_t bytes;
};

// Every live shared block by its address.
struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, Block> blocks;
  std::uint64_t next_serial = 1;
  std::size_t max_blocks = 0;  // half the file descriptors this process may open: files need the rest
};

Registry& registry() {
  static auto* r = new Registry;  // outlives the static allocators that free into it at exit
  return *r;
}

}  // namespace

void enable() {
  // Each block holds a file descriptor: ask for the most the system allows, and keep half of it.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    rlimit raised = files;
    raised.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
  }
  Registry& r = registry();
  {
    std::lock_guard lock(r.mutex);
    r.max_blocks = files.rlim_cur == RLIM_INFINITY ? std::size_t{1} << 20 : static_cast<std::size_t>(files.rlim_cur / 2);
  }
  sharing.store(true, std::memory_order_release);
}
bool enabled() { return sharing.load(std::memory_order_acquire); }

File make_file(std::size_t bytes) {
  const int fd = memfd_create("nax-host-memory", MFD_CLOEXEC);
  if (fd < 0) return {};
  void* at = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) {
    close(fd);
    return {};
  }
  return {fd, at};
}

void release_file(const File& file, std::size_t bytes) {
  if (file.at != nullptr) munmap(file.at, bytes);
  if (file.fd >= 0) close(file.fd);
}

const void* map_peer_file(std::int64_t pid, std::int64_t fd, std::size_t bytes) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int here = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (here < 0) return nullptr;
  const void* mapped = nullptr;
  struct stat st {};
  if (fstat(here, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= bytes) {
    void* at = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, here, 0);
    if (at != MAP_FAILED) mapped = at;
  }
  close(here);
  return mapped;
}

void unmap_peer_file(const void* at, std::size_t bytes) {
  if (at != nullptr) munmap(const_cast<void*>(at), bytes);
}

void* allocate(std::size_t bytes) {
  if (!enabled() || bytes < kMinBytes) return nullptr;
  Registry& r = registry();
  {
    std::lock_guard lock(r.mutex);
    if (r.blocks.size() >= r.max_blocks) return nullptr;
  }
  const File file = make_file(bytes);
  if (file.at == nullptr) return nullptr;
  static_cast<void>(madvise(file.at, bytes, MADV_HUGEPAGE));  // granted only where shmem_enabled allows it
  std::lock_guard lock(r.mutex);
  r.blocks.emplace(reinterpret_cast<std::uintptr_t>(file.at), Block{file.fd, r.next_serial++, bytes});
  return file.at;
}

bool free(void* ptr) {
  if (!enabled()) return false;  // none was ever made
  Registry& r = registry();
  Block block{};
  {
    std::lock_guard lock(r.mutex);
    auto it = r.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == r.blocks.end()) return false;
    block = it->second;
    r.blocks.erase(it);
  }
  release_file({block.fd, ptr}, block.bytes);
  return true;
}

std::optional<Segment> segment_of(const void* ptr, std::size_t bytes) {
  if (!enabled()) return std::nullopt;
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.blocks.upper_bound(at);
  if (it == r.blocks.begin()) return std::nullopt;
  it = std::prev(it);
  const auto& [base, block] = *it;
  if (at + bytes > base + block.bytes) return std::nullopt;
  return Segment{block.fd, block.serial, base, block.bytes};
}

}  // namespace nax::shared_host_memory
