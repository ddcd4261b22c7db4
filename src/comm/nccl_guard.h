#pragma once
// What turns NCCL's failure modes (a hang on a mismatched collective or a dead peer, an error only
// reported asynchronously) into nax::Errors, written against a table of the NCCL/CUDA calls it needs
// (NcclOps) so that it builds and is tested without CUDA: NcclCommunicator fills the table with the
// real calls, tests/test_nccl_guard.cpp with a fake group of threads.
//
// - check_signature (checking mode): before each collective the ranks all-gather a fixed-size
//   signature (kind, dtype, count, detail, pairs hash, the calling op's name) and compare; a
//   mismatch throws "device i called X but device j called Y" on every rank, as the thread and MPI
//   communicators do, instead of NCCL pairing unrelated calls.
// - wait: polls the enqueued work and ncclCommGetAsyncError until the work is done; an async error
//   or the collective timeout aborts the communicator (ncclCommAbort) and throws naming the call.
// - drain_gpu: the device allocator calls it before cudaFree (which synchronises the device and can
//   deadlock against NCCL kernels waiting for peers): it waits for every live guard's work first.
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/signature.h"

namespace nax::comm {

struct NcclOps {
  enum class Status { ok, in_progress, error };
  // ncclCommGetAsyncError: ok, in_progress (a non-blocking call still running) or error, with text.
  std::function<Status(std::string& message)> async_error;
  // cudaStreamQuery on the communicator's stream: whether everything enqueued so far has finished.
  std::function<bool()> idle;
  // ncclCommAbort: frees the communicator and unblocks its kernels; later calls must not use it.
  std::function<void()> abort;
  // Enqueues an all-gather of `words` 64-bit words from each rank (mine), returning where the
  // rank-major result (size * words) will be once idle() says so (pinned host memory on CUDA, so
  // that no copy waits on the stream).
  std::function<const std::int64_t*(const std::int64_t* mine, std::size_t words)> all_gather_words;
  int gpu = -1;  // the GPU whose memory frees drain this communicator's work (drain_gpu)
};

class NcclGuard {
 public:
  // label names the group in messages ("group (mp) of devices [0,1]"); devices[r] is rank r's mesh
  // device. poll is how long wait sleeps between polls once the work did not finish at once.
  NcclGuard(NcclOps ops, std::string label, std::vector<int> devices, int rank, std::chrono::duration<double> timeout,
            std::chrono::microseconds poll = std::chrono::microseconds(50));
  ~NcclGuard();
  NcclGuard(const NcclGuard&) = delete;
  NcclGuard& operator=(const NcclGuard&) = delete;

  // Exchanges signatures and throws, on every rank, naming two that differ. `origin` names the op.
  void check_signature(const CollectiveSignature& sig);
  // Returns once all enqueued work has finished; on an async error or past the timeout, aborts the
  // communicator and throws. `what` describes the call waited for.
  void wait(const std::string& what);
  // Throws if the communicator was aborted (every call after an abort).
  void check_usable(const std::string& what) const;
  bool aborted() const { return aborted_; }

  // Waits for the work of every live guard on `gpu` (-1: on every GPU), before memory NCCL may use
  // is freed there.
  static void drain_gpu(int gpu = -1);

  static constexpr std::size_t kOriginWords = 12;  // the op's name travels in 96 bytes
  static constexpr std::size_t kSignatureWords = 6 + kOriginWords;  // kind, dtype, count, detail, pairs, call site

 private:
  [[noreturn]] void abort_and_fail(const std::string& why);

  NcclOps ops_;
  std::string label_;
  std::vector<int> devices_;
  int rank_;
  std::chrono::duration<double> timeout_;
  std::chrono::microseconds poll_;
  bool aborted_ = false;
  std::mutex wait_mutex_;  // wait from this device's thread and from drain_gpu on another
};

}  // namespace nax::comm
