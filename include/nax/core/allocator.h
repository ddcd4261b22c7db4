#pragma once
// A per-device caching allocator: freed blocks go back to size-class free lists and are reused by
// the next request of the same class, so a training step does not return to the system allocator.
#include <cstddef>
#include <memory>

namespace nax {

struct AllocatorStats {
  std::size_t bytes_in_use = 0;       // requested bytes currently held by live buffers
  std::size_t peak_bytes_in_use = 0;  // high-water mark of bytes_in_use since the last reset
  std::size_t bytes_reserved = 0;     // bytes obtained from the system (in use + cached)
  std::size_t allocations = 0;        // allocate() calls
  std::size_t cache_hits = 0;         // allocate() calls served from the cache
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() = 0;  // returns cached blocks to the system
};

// Host memory, 64-byte aligned, cached by power-of-two size class (1.25x steps above 1 MiB).
std::shared_ptr<Allocator> make_caching_host_allocator();

}  // namespace nax
