#include "comm/nccl/nccl_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "comm/element_at.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_allocator.h"
#include "nax/core/error.h"

namespace nax::cuda {

namespace {

ncclDataType_t nccl_type(DType dtype, std::string_view op) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
  }
  fail(op, "dtype {} is not supported by the NCCL communicator", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  fail("nccl", "unknown reduce op {}", static_cast<int>(op));
}

}  // namespace

NcclCommunicator::NcclCommunicator(const ncclUniqueId& id, int nranks, int rank, int device, cudaStream_t stream)
    : rank_(rank), size_(nranks), device_(device), stream_(stream) {
  if (nranks < 1 || rank < 0 || rank >= nranks) fail("NcclCommunicator", "rank {} of {} is out of range", rank, nranks);
  DeviceGuard guard(device_);
  follow_started();
  NAX_NCCL_CHECK(ncclCommInitRank(&comm_, nranks, id, rank));
  init_scratch();
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int device, cudaStream_t stream) : comm_(comm), device_(device), stream_(stream) {
  NAX_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  NAX_NCCL_CHECK(ncclCommCount(comm_, &size_));
  DeviceGuard guard(device_);
  init_scratch();
}

void NcclCommunicator::init_scratch() {
  const cudaError_t status = cudaMalloc(&scratch_, sizeof(float));
  if (status != cudaSuccess) {
    (void)ncclCommDestroy(comm_);
    NAX_CUDA_CHECK(status);
  }
}

NcclCommunicator::~NcclCommunicator() {
  QuietDeviceGuard guard(device_);  // a destructor must not throw (after a sticky CUDA error, say)
  guard_.reset();
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  if (signatures_device_ != nullptr) (void)cudaFree(signatures_device_);
  if (signatures_host_ != nullptr) (void)cudaFreeHost(signatures_host_);
  if (last_started_ != nullptr) (void)cudaEventDestroy(last_started_);
  if (side_stream_ != nullptr) (void)cudaStreamDestroy(side_stream_);
  if (comm_ != nullptr) (void)ncclCommDestroy(comm_);  // null once aborted
}

void NcclCommunicator::guard(std::string label, std::vector<int> devices, double timeout_s, bool check_collectives) {
  if (static_cast<int>(devices.size()) != size_)
    fail("NcclCommunicator::guard", "{} devices named for a group of {} ranks", devices.size(), size_);
  const std::size_t words = comm::NcclGuard::kSignatureWords * static_cast<std::size_t>(size_ + 1);
  DeviceGuard device_guard(device_);
  NAX_CUDA_CHECK(cudaMallocHost(&signatures_host_, words * sizeof(std::int64_t)));
  NAX_CUDA_CHECK(cudaMalloc(&signatures_device_, words * sizeof(std::int64_t)));
  check_collectives_ = check_collectives;
  guard_ = std::make_unique<comm::NcclGuard>(real_ops(), std::move(label), std::move(devices), rank_,
                                             std::chrono::duration<double>(timeout_s), std::chrono::microseconds(20));
  set_before_device_free(&comm::NcclGuard::drain_gpu);
}

comm::NcclOps NcclCommunicator::real_ops() {
  comm::NcclOps ops;
  ops.gpu = device_;
  ops.async_error = [this](std::string& message) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
    if (asked != ncclSuccess) state = asked;
    if (state == ncclSuccess) return comm::NcclOps::Status::ok;
    if (state == ncclInProgress) return comm::NcclOps::Status::in_progress;
    message = fmt::format("{} ({})", ncclGetErrorString(state), ncclGetLastError(comm_));
    return comm::NcclOps::Status::error;
  };
  ops.idle = [this] {
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaErrorNotReady) return false;
    return true;  // done, or a CUDA error that the next checked call reports
  };
  ops.abort = [this] {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  };
  ops.all_gather_words = [this](const std::int64_t* mine, std::size_t words) -> const std::int64_t* {
    const std::size_t all = words * static_cast<std::size_t>(size_);
    DeviceGuard guard(device_);
    std::copy(mine, mine + words, signatures_host_ + all);
    NAX_CUDA_CHECK(cudaMemcpyAsync(signatures_device_ + all, signatures_host_ + all, words * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream_));
    NAX_NCCL_CHECK(ncclAllGather(signatures_device_ + all, signatures_device_, words, ncclInt64, comm_, stream_));
    NAX_CUDA_CHECK(cudaMemcpyAsync(signatures_host_, signatures_device_, all * sizeof(std::int64_t), cudaMemcpyDeviceToHost, stream_));
    return signatures_host_;
  };
  return ops;
}

void NcclCommunicator::begin(std::size_t bytes, const CollectiveSignature& sig) {
  record(sig.kind, bytes);
  if (!guard_) return;
  guard_->check_usable(sig.str());
  if (!check_collectives_ || size_ == 1) return;
  // The exchange is an NCCL call on this communicator: after the started ones, as every NCCL call.
  DeviceGuard device_guard(device_);
  follow_started();
  guard_->check_signature(sig);
}

std::string NcclCommunicator::describe() const { return fmt::format("nccl rank {} of {} on cuda:{}", rank_, size_, device_); }

void NcclCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) {
  const ncclDataType_t type = nccl_type(dtype, "all_reduce");
  begin(count * dtype_size(dtype), signature_of(call, CollectiveKind::all_reduce, dtype, count, static_cast<int>(op)));
  DeviceGuard guard(device_);
  follow_started();
  NAX_NCCL_CHECK(ncclAllReduce(send, recv, count, type, nccl_op(op), comm_, stream_));
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) {
  const ncclDataType_t type = nccl_type(dtype, "all_gather");
  begin(count * dtype_size(dtype), signature_of(call, CollectiveKind::all_gather, dtype, count));
  DeviceGuard guard(device_);
  follow_started();
  NAX_NCCL_CHECK(ncclAllGather(send, recv, count, type, comm_, stream_));
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) {
  const ncclDataType_t type = nccl_type(dtype, "reduce_scatter");
  begin(count * static_cast<std::size_t>(size_) * dtype_size(dtype), signature_of(call, CollectiveKind::reduce_scatter, dtype, count, static_cast<int>(op)));
  DeviceGuard guard(device_);
  follow_started();
  NAX_NCCL_CHECK(ncclReduceScatter(send, recv, count, type, nccl_op(op), comm_, stream_));
}

void NcclCommunicator::all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) {
  const ncclDataType_t type = nccl_type(dtype, "all_to_all");
  begin(count * static_cast<std::size_t>(size_) * dtype_size(dtype), signature_of(call, CollectiveKind::all_to_all, dtype, count));
  DeviceGuard guard(device_);
  follow_started();
  NAX_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    const std::size_t offset = count * static_cast<std::size_t>(r);
    NAX_NCCL_CHECK(ncclSend(comm::element_at(send, offset, dtype), count, type, r, comm_, stream_));
    NAX_NCCL_CHECK(ncclRecv(comm::element_at(recv, offset, dtype), count, type, r, comm_, stream_));
  }
  NAX_NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::permute(const void* send, void* recv, std::size_t count, DType dtype,
                               const std::vector<std::pair<int, int>>& pairs, const Call& call) {
  check_permute_pairs(pairs, size_, "permute", describe());
  const ncclDataType_t type = nccl_type(dtype, "permute");
  begin(count * dtype_size(dtype), signature_of(call, CollectiveKind::permute, dtype, count, 0, hash_pairs(pairs)));
  const std::size_t bytes = count * dtype_size(dtype);
  auto to = std::find_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == rank_; });
  auto from = std::find_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.second == rank_; });
  DeviceGuard guard(device_);
  follow_started();
  if (from == pairs.end()) NAX_CUDA_CHECK(cudaMemsetAsync(recv, 0, bytes, stream_));
  if (to != pairs.end() && to->second == rank_) {  // to itself: a copy, no NCCL
    NAX_CUDA_CHECK(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  NAX_NCCL_CHECK(ncclGroupStart());
  if (to != pairs.end()) NAX_NCCL_CHECK(ncclSend(send, count, type, to->second, comm_, stream_));
  if (from != pairs.end()) NAX_NCCL_CHECK(ncclRecv(recv, count, type, from->first, comm_, stream_));
  NAX_NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call) {
  if (root < 0 || root >= size_) fail("broadcast", "root {} is out of range for a group of {} ranks", root, size_);
  const ncclDataType_t type = nccl_type(dtype, "broadcast");
  begin(count * dtype_size(dtype), signature_of(call, CollectiveKind::broadcast, dtype, count, root));
  DeviceGuard guard(device_);
  follow_started();
  NAX_NCCL_CHECK(ncclBroadcast(send, recv, count, type, root, comm_, stream_));
}

void NcclCommunicator::barrier(const Call& call) {
  const CollectiveSignature sig = signature_of(call, CollectiveKind::barrier, DType::f32, 0);
  begin(0, sig);
  DeviceGuard guard(device_);
  follow_started();
  NAX_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
  if (guard_) guard_->wait(sig.str());  // polls for errors; aborts past the timeout
  else NAX_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

namespace {

// A collective on the side stream: waiting orders the compute stream after its event.
class NcclRequest final : public Communicator::Request {
 public:
  NcclRequest(int device, cudaStream_t compute, cudaEvent_t done) : device_(device), compute_(compute), done_(done) {}
  ~NcclRequest() override {
    QuietDeviceGuard guard(device_);
    if (!waited_) (void)cudaStreamWaitEvent(compute_, done_, 0);  // buffers the compute stream frees stay valid
    (void)cudaEventDestroy(done_);
  }
  void wait() override {
    if (std::exchange(waited_, true)) return;
    DeviceGuard guard(device_);
    NAX_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
  }

 private:
  int device_;
  cudaStream_t compute_;
  cudaEvent_t done_;
  bool waited_ = false;
};

}  // namespace

void NcclCommunicator::follow_started() {
  if (last_started_ == nullptr) return;
  NAX_CUDA_CHECK(cudaStreamWaitEvent(stream_, last_started_, 0));
  NAX_CUDA_CHECK(cudaEventDestroy(std::exchange(last_started_, nullptr)));
}

template <typename Enqueue>
std::unique_ptr<Communicator::Request> NcclCommunicator::on_side_stream(Enqueue&& enqueue) {
  DeviceGuard guard(device_);
  if (side_stream_ == nullptr) NAX_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
  cudaEvent_t ready = nullptr, done = nullptr, last = nullptr;
  NAX_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  NAX_CUDA_CHECK(cudaEventRecord(ready, stream_));
  NAX_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, ready, 0));
  NAX_CUDA_CHECK(cudaEventDestroy(ready));
  const cudaStream_t compute = std::exchange(stream_, side_stream_);
  const cudaEvent_t followed = std::exchange(last_started_, nullptr);  // the side stream is ordered already
  try {
    enqueue();
  } catch (...) {
    stream_ = compute;
    last_started_ = followed;
    throw;
  }
  stream_ = compute;
  if (followed != nullptr) NAX_CUDA_CHECK(cudaEventDestroy(followed));
  NAX_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  NAX_CUDA_CHECK(cudaEventRecord(done, side_stream_));
  NAX_CUDA_CHECK(cudaEventCreateWithFlags(&last, cudaEventDisableTiming));
  NAX_CUDA_CHECK(cudaEventRecord(last, side_stream_));
  last_started_ = last;
  return std::make_unique<NcclRequest>(device_, stream_, done);
}

std::unique_ptr<Communicator::Request> NcclCommunicator::start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                                                          ReduceOp op, const Call& call) {
  return on_side_stream([&] { all_reduce(send, recv, count, dtype, op, call); });
}

std::unique_ptr<Communicator::Request> NcclCommunicator::start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) {
  return on_side_stream([&] { all_gather(send, recv, count, dtype, call); });
}

std::unique_ptr<Communicator::Request> NcclCommunicator::start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                                                              ReduceOp op, const Call& call) {
  return on_side_stream([&] { reduce_scatter(send, recv, count, dtype, op, call); });
}

std::unique_ptr<Communicator::Request> NcclCommunicator::start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                                                       const std::vector<std::pair<int, int>>& pairs, const Call& call) {
  return on_side_stream([&] { permute(send, recv, count, dtype, pairs, call); });
}

ncclUniqueId make_nccl_id() {
  ncclUniqueId id;
  NAX_NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_group(const std::vector<int>& devices, const std::vector<cudaStream_t>& streams) {
  if (devices.empty()) fail("make_nccl_group", "no devices");
  if (!streams.empty() && streams.size() != devices.size())
    fail("make_nccl_group", "{} devices but {} streams", devices.size(), streams.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  NAX_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
  std::vector<std::unique_ptr<NcclCommunicator>> group;
  for (std::size_t i = 0; i < devices.size(); ++i)
    group.push_back(std::make_unique<NcclCommunicator>(comms[i], devices[i], streams.empty() ? cudaStream_t{} : streams[i]));
  return group;
}

}  // namespace nax::cuda
