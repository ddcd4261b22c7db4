#include "nax/core/allocator.h"

#include "core/peak_trace.h"
#include "core/shared_host_memory.h"

#include <sys/mman.h>

#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>

namespace nax {

std::size_t caching_size_class(std::size_t bytes, std::size_t min_block) {
  if (bytes <= min_block) return min_block;
  std::size_t p = std::bit_ceil(bytes);
  if (p <= (std::size_t{1} << 20)) return p;
  std::size_t step = p / 8;  // p/2 .. p in quarters of p/2
  return (bytes + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(std::size_t min_block) : min_block_(min_block), peak_trace_(PeakTrace::from_environment()) {}

CachingAllocator::~CachingAllocator() = default;

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t cls = caching_size_class(bytes, min_block_);
  std::lock_guard lock(mutex_);
  stats_.allocations += 1;
  void* ptr = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.cache_hits += 1;
  } else {
    ptr = raw_allocate(cls);
    if (ptr == nullptr) {
      release_cached();  // give the cache back and try once more
      ptr = raw_allocate(cls);
      if (ptr == nullptr) out_of_memory(cls, stats_);
    }
    stats_.bytes_reserved += cls;
  }
  stats_.bytes_in_use += bytes;
  if (peak_trace_) peak_trace_->allocated(ptr, bytes);
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
    if (peak_trace_) peak_trace_->peak(stats_.bytes_in_use);
  }
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  stats_.bytes_in_use -= bytes;
  if (peak_trace_) peak_trace_->freed(ptr);
  free_[caching_size_class(bytes, min_block_)].push_back(ptr);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  if (peak_trace_) peak_trace_->reset(stats_.bytes_in_use);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cached();
}

void CachingAllocator::release_cached() {
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) raw_free(p);
    stats_.bytes_reserved -= cls * blocks.size();
  }
  free_.clear();
}

namespace {

constexpr std::size_t kAlignment = 64;
// Blocks of at least a huge page start on one and ask for huge pages: a step's large tensors then
// cost 512 times fewer page faults and TLB entries, and the MPI communicator's copy of a block it
// cannot map (process_vm_readv pins it page by page) runs at memcpy's speed instead of half of it.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

void* allocate_host(std::size_t bytes) {
  if (void* shared = shared_host_memory::allocate(bytes)) return shared;
  if (bytes < kHugePage) return std::aligned_alloc(kAlignment, bytes);
  void* ptr = nullptr;
  if (posix_memalign(&ptr, kHugePage, bytes) != 0) return nullptr;
  static_cast<void>(madvise(ptr, bytes / kHugePage * kHugePage, MADV_HUGEPAGE));  // advice: refused is fine
  return ptr;
}

class CachingHostAllocator final : public CachingAllocator {
 public:
  CachingHostAllocator() : CachingAllocator(kAlignment) {}
  ~CachingHostAllocator() override { empty_cache(); }

 private:
  void* raw_allocate(std::size_t bytes) override { return allocate_host(bytes); }
  void raw_free(void* ptr) override {
    if (!shared_host_memory::free(ptr)) std::free(ptr);
  }
  [[noreturn]] void out_of_memory(std::size_t, const AllocatorStats&) override { throw std::bad_alloc(); }
};

}  // namespace

std::shared_ptr<Allocator> make_caching_host_allocator() { return std::make_shared<CachingHostAllocator>(); }

}  // namespace nax
