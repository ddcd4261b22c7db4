#pragma once
// Communicator: collectives over one group of ranks, on contiguous buffers (NCCL's semantics).
// Backends live in src/comm/<backend>/; the runtime makes one per device and set of mesh axes.
// Every rank of the group must make the same calls in the same order; a backend that can tell
// raises a nax::Error on every rank when they differ. Only all_reduce may run in place
// (send == recv); the other collectives need distinct buffers.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nax/core/dtype.h"
#include "nax/core/reduce_op.h"

namespace nax {

enum class CollectiveKind { all_reduce, all_gather, reduce_scatter, all_to_all, permute, broadcast, barrier };
inline constexpr int kCollectiveKinds = 7;
std::string_view collective_name(CollectiveKind kind);

// Calls and bytes sent by this rank, per collective kind.
struct CommStats {
  std::array<std::size_t, kCollectiveKinds> calls{};
  std::array<std::size_t, kCollectiveKinds> bytes{};
};

// Totals over all kinds.
std::size_t total_calls(const CommStats& s);
std::size_t total_bytes(const CommStats& s);
CommStats operator-(const CommStats& a, const CommStats& b);
CommStats& operator+=(CommStats& a, const CommStats& b);

// Checks that `pairs` (src, dst) is a partial permutation of the ranks 0..n-1: in range, no rank
// the source or the destination twice. Errors name `op`, `group` ("the group over mp") and what
// `detail` returns (e.g. the tensor), built only on failure.
void check_permute_pairs(const std::vector<std::pair<int, int>>& pairs, int n, std::string_view op, std::string_view group,
                         const std::function<std::string()>& detail = {});

// Where a named collective was called in user code, and whether it runs as the backward
// (transpose) of that call. Two ranks at different call sites disagree even when their buffers
// look alike (e.g. two same-shaped psums issued in opposite orders). Built from a
// std::source_location by the collectives (this header stays free of it for nvcc).
struct CallSite {
  const char* file = "";
  std::uint32_t line = 0;
  std::uint32_t column = 0;
  const char* backward_of = nullptr;  // the forward collective, when this call is its transpose
  // A hash of the call's arguments that every rank must pass alike beyond the buffer's size (the
  // tensor's shape and axes, the axis gathered or scattered): two ranks at one line that gather
  // along different axes of same-sized tensors disagree.
  std::uint64_t arguments = 0;
  // In a backward: which of the group's calls the forward was (Communicator::count_call). Devices
  // whose backwards run the transposes of different calls (one skipped, where a device left a
  // collective's result unused) then disagree at the first one, even at one line in a loop.
  std::uint64_t transposes = 0;

  std::string str() const;  // "tests/test_x.cpp:12:7"
  // "psum(...) at tests/test_x.cpp:12:7", "psum_scatter(...) in the backward of all_gather at ..."
  std::string label(std::string_view call) const;
  std::uint64_t hash() const;  // 0 for an unknown site
};

// Which named collective makes a communicator call, passed with the call: its text and site
// ("psum(f32[i=4] varying{mp}, mp) at f.cpp:12:7", named in a backend's errors) and the site's
// hash (CallSite::hash, with the call's arguments), which every signature the group compares
// carries. A call made outside the named collectives passes none.
struct Call {
  std::string origin;
  std::uint64_t site = 0;
  // A started call's number on its device's thread (0: blocking): the trace's slices of its start,
  // its transfer and its completion carry it, so that a replay pairs them.
  std::uint64_t ticket = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;  // backend and group, for error messages

  // The number of the named collective the op layer now calls on this group, counted from 1:
  // every member makes the same calls in the same order, so the numbers agree across the group.
  std::uint64_t count_call() { return ++calls_; }

  // recv[i] = op over ranks of send[i], `count` elements.
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) = 0;
  // The all-reduce of several buffers as one: recv holds parts.size() blocks of `count`, block i
  // = op over ranks of parts[i]. Where reduces_parts() it is one call that reads the parts where
  // they are; the default makes one all_reduce per part (a caller that needs one call, as
  // deterministic psum does for the rank tree's bits, copies the parts end to end instead).
  virtual void all_reduce_parts(const std::vector<const void*>& parts, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                const Call& call = {});
  virtual bool reduces_parts() const { return false; }
  // recv = concatenation of every rank's `count` elements, in rank order.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) = 0;
  // send holds size() blocks of `count`; recv = op over ranks of block rank().
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) = 0;
  // send holds size() blocks of `count`; block j goes to rank j; recv block j came from rank j.
  virtual void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) = 0;
  // For each (src, dst), dst receives src's `count` elements; a rank that is no destination gets zeros.
  virtual void permute(const void* send, void* recv, std::size_t count, DType dtype,
                       const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) = 0;
  virtual void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call = {}) = 0;
  virtual void barrier(const Call& call = {}) = 0;

  // Whether this all_reduce or reduce_scatter (`kind`, with the call's count and dtype) adds the
  // ranks' values in the halving tree, (r0 + r1) + (r2 + r3), on every rank: deterministic mode's
  // psum then calls it instead of gathering every rank's value. Any communicator does on two ranks
  // (one addition per element, and addition is commutative); the host threads' always, MPI's when
  // it reads the peers' buffers itself.
  virtual bool adds_in_rank_tree(CollectiveKind /*kind*/, std::size_t /*count*/, DType /*dtype*/) const { return size() <= 2; }

  // A collective started and not yet waited for: its buffers must stay alive and untouched until
  // wait() returns. wait() raises what the blocking form would (a mismatch, a timeout, an abort);
  // a request destroyed without wait() waits first, quietly.
  class Request {
   public:
    virtual ~Request() = default;
    virtual void wait() = 0;
  };
  // Start forms of the collectives above: same arguments, same order rules (a start counts as the
  // call, in the order started), the result in recv once the request is waited for. The defaults
  // run the blocking form and return a finished request; backends that can overlap override them.
  virtual std::unique_ptr<Request> start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {});
  virtual std::unique_ptr<Request> start_all_reduce_parts(const std::vector<const void*>& parts, void* recv, std::size_t count,
                                                          DType dtype, ReduceOp op, const Call& call = {});
  virtual std::unique_ptr<Request> start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {});
  virtual std::unique_ptr<Request> start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {});
  virtual std::unique_ptr<Request> start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                                 const std::vector<std::pair<int, int>>& pairs, const Call& call = {});

  const CommStats& stats() const { return stats_; }

 protected:
  void record(CollectiveKind kind, std::size_t bytes) {
    stats_.calls[static_cast<int>(kind)] += 1;
    stats_.bytes[static_cast<int>(kind)] += bytes;
  }

 private:
  CommStats stats_;
  std::uint64_t calls_ = 0;
};

}  // namespace nax
