#pragma once
// A per-device caching allocator: freed blocks go back to size-class free lists and are reused by
// the next request of the same class, so a training step does not return to the system allocator.
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

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

// The size class a request of `bytes` is served from: powers of two from `min_block` up to 1 MiB,
// then steps of a quarter of the power of two below (large tensors waste at most 25%).
std::size_t caching_size_class(std::size_t bytes, std::size_t min_block);

// What held memory at an allocator's high-water mark, for finding what a memory plan misses: with
// NAX_MEMORY_PEAK_TRACE=FILE in the environment every allocation keeps its call stack, the live
// ones are noted at each new peak, and when the allocator goes the note is written to FILE (the
// process's first allocator; FILE.1, FILE.2, ... for the others in the order they were made, a
// device each; "%p" in FILE becomes the process id), grouped by call stack, largest first,
// symbolized by addr2line where it is installed. Slow: a debugging aid.
class PeakTrace;

// The caching over a backend's raw allocation (host memory, cudaMalloc, ...): free lists per size
// class, statistics, and one retry after emptying the cache when the raw allocation fails.
class CachingAllocator : public Allocator {
 public:
  ~CachingAllocator() override;  // a backend's destructor calls empty_cache()
  void* allocate(std::size_t bytes) final;
  void deallocate(void* ptr, std::size_t bytes) final;
  AllocatorStats stats() const final;
  void reset_peak() final;
  void empty_cache() final;

 protected:
  explicit CachingAllocator(std::size_t min_block);
  virtual void* raw_allocate(std::size_t bytes) = 0;  // nullptr when out of memory
  virtual void raw_free(void* ptr) = 0;
  [[noreturn]] virtual void out_of_memory(std::size_t bytes, const AllocatorStats& stats) = 0;

 private:
  void release_cached();  // with mutex_ held

  std::size_t min_block_;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
  std::unique_ptr<PeakTrace> peak_trace_;  // NAX_MEMORY_PEAK_TRACE
};

// Host memory, 64-byte aligned, cached by size class.
std::shared_ptr<Allocator> make_caching_host_allocator();

}  // namespace nax
