#include "nax/core/allocator.h"

#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace nax {

namespace {

constexpr std::size_t kAlignment = 64;

// Power-of-two classes up to 1 MiB, then steps of 1/4 of the power of two below, so large
// tensors waste at most 25%.
std::size_t size_class(std::size_t bytes) {
  if (bytes <= kAlignment) return kAlignment;
  std::size_t p = std::bit_ceil(bytes);
  if (p <= (std::size_t{1} << 20)) return p;
  std::size_t step = p / 8;  // p/2 .. p in quarters of p/2
  return (bytes + step - 1) / step * step;
}

class CachingHostAllocator final : public Allocator {
 public:
  ~CachingHostAllocator() override { empty_cache(); }

  void* allocate(std::size_t bytes) override {
    std::size_t cls = size_class(bytes);
    std::lock_guard lock(mutex_);
    stats_.allocations += 1;
    void* ptr = nullptr;
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      stats_.cache_hits += 1;
    } else {
      ptr = std::aligned_alloc(kAlignment, cls);
      if (ptr == nullptr) throw std::bad_alloc();
      stats_.bytes_reserved += cls;
    }
    stats_.bytes_in_use += bytes;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
    return ptr;
  }

  void deallocate(void* ptr, std::size_t bytes) override {
    if (ptr == nullptr) return;
    std::lock_guard lock(mutex_);
    stats_.bytes_in_use -= bytes;
    free_[size_class(bytes)].push_back(ptr);
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) std::free(p);
      stats_.bytes_reserved -= cls * blocks.size();
    }
    free_.clear();
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace

std::shared_ptr<Allocator> make_caching_host_allocator() { return std::make_shared<CachingHostAllocator>(); }

}  // namespace nax
