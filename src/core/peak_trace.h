#pragma once
// NAX_MEMORY_PEAK_TRACE (nax/core/allocator.h): the live allocations at an allocator's
// high-water mark, by call stack. Called by CachingAllocator with its mutex held.
#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace nax {

class PeakTrace {
 public:
  // The trace NAX_MEMORY_PEAK_TRACE asks for, or null.
  static std::unique_ptr<PeakTrace> from_environment();
  explicit PeakTrace(std::string path) : path_(std::move(path)) {}
  ~PeakTrace();  // writes the report
  PeakTrace(const PeakTrace&) = delete;
  PeakTrace& operator=(const PeakTrace&) = delete;

  void allocated(void* ptr, std::size_t bytes);
  void freed(void* ptr);
  void peak(std::size_t in_use);   // a new high-water mark
  void reset(std::size_t in_use);  // the allocator's peak was reset (e.g. after warm-up steps)

  static constexpr int kFrames = 28;
  struct Live {
    std::size_t bytes = 0;
    std::array<void*, kFrames> frames{};
    int depth = 0;
  };

 private:
  void write() const;

  std::string path_;
  std::unordered_map<void*, Live> live_;
  std::vector<Live> at_peak_;  // the live allocations when the peak was last noted
  std::size_t peak_ = 0, noted_ = 0;
};

}  // namespace nax
