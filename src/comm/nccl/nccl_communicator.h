#pragma once
// nax::Communicator over NCCL, for one group: buffers are device pointers on this communicator's
// device, and every collective is enqueued on its stream and returns at once (NCCL's semantics;
// the caller synchronises the stream before reading the results on the host). barrier() alone
// waits: it all-reduces one element and synchronises the stream.
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "comm/nccl_guard.h"
#include "nax/comm/communicator.h"

namespace nax::cuda {

class NcclCommunicator final : public Communicator {
 public:
  // Joins the group of `nranks` that `id` names (ncclCommInitRank; every rank must call it, from
  // its own thread or process). `stream` is not owned.
  NcclCommunicator(const ncclUniqueId& id, int nranks, int rank, int device, cudaStream_t stream);
  // Adopts a communicator made elsewhere (make_nccl_group).
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t stream);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override;
  // Not even on two ranks: NCCL may reduce in the NVLink switch (NVLS), whose additions are not
  // checked against IEEE's here; deterministic psum gathers instead.
  bool adds_in_rank_tree(CollectiveKind, std::size_t, DType) const override { return false; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t comm() const { return comm_; }

  // Turns failures into errors (comm/nccl_guard.h): polls ncclCommGetAsyncError while waiting,
  // aborts the communicator on an error or after timeout_s, and with check_collectives compares
  // the ranks' signatures before each collective (an 8-word NCCL all-gather and a host wait:
  // a debugging mode's cost). `label` and `devices` (rank -> mesh device) name them in messages.
  // Without it (make_nccl_group), collectives are NCCL's alone.
  void guard(std::string label, std::vector<int> devices, double timeout_s, bool check_collectives);

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  void permute(const void* send, void* recv, std::size_t count, DType dtype, const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) override;
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call = {}) override;
  void barrier(const Call& call = {}) override;

  // Started collectives run on a side stream of this communicator, after the work enqueued so far
  // on the compute stream; waiting makes the compute stream wait for them (the host does not).
  // Collectives enqueued later, started or not, follow them: NCCL sees one order per rank.
  std::unique_ptr<Request> start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  std::unique_ptr<Request> start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call = {}) override;
  std::unique_ptr<Request> start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call = {}) override;
  std::unique_ptr<Request> start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                         const std::vector<std::pair<int, int>>& pairs, const Call& call = {}) override;

 private:
  void init_scratch();
  // Records the call and, when guarded, refuses it after an abort and checks its signature.
  void begin(std::size_t bytes, const CollectiveSignature& sig);
  comm::NcclOps real_ops();
  // Runs `enqueue` (a blocking form) on the side stream and returns the request for it.
  template <typename Enqueue>
  std::unique_ptr<Request> on_side_stream(Enqueue&& enqueue);
  // Orders the compute stream after the started collectives (before a blocking one).
  void follow_started();

  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t last_started_ = nullptr;  // the side stream's latest started collective, until followed
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 0, device_ = 0;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;  // barrier's one element
  std::unique_ptr<comm::NcclGuard> guard_;
  bool check_collectives_ = false;
  std::int64_t* signatures_host_ = nullptr;    // pinned: every rank's signature, then this rank's
  std::int64_t* signatures_device_ = nullptr;  // the same on the device
};

ncclUniqueId make_nccl_id();

// One group over `devices` (GPUs of this process, usually driven by one thread each afterwards):
// rank i runs on devices[i] with streams[i] (empty: the default stream). ncclCommInitAll.
std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_group(const std::vector<int>& devices,
                                                               const std::vector<cudaStream_t>& streams = {});

}  // namespace nax::cuda
