#include "comm/local/device_communicator.h"

#include <algorithm>

#include "comm/element_at.h"
#include "nax/kernels/kernels.h"

namespace nax::local {

namespace {

// Device memory for the length of one collective.
class Scratch {
 public:
  Scratch(Allocator& allocator, std::size_t bytes) : allocator_(allocator), bytes_(bytes), data_(allocator.allocate(bytes)) {}
  ~Scratch() { allocator_.deallocate(data_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* data() const { return data_; }

 private:
  Allocator& allocator_;
  std::size_t bytes_;
  void* data_;
};

class DeviceCommunicator final : public Communicator {
 public:
  DeviceCommunicator(std::shared_ptr<LocalGroup> group, int rank, std::shared_ptr<Device> device)
      : group_(std::move(group)), rank_(rank), device_(std::move(device)) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string describe() const override { return "device-local " + group_->label(); }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) override {
    record(CollectiveKind::all_reduce, count * dtype_size(dtype));
    join(signature_of(call, CollectiveKind::all_reduce, dtype, count, static_cast<int>(op)), send, recv);
    // This rank reduces its 1/n slice into scratch (recv may alias send), then writes it to every
    // rank's recv buffer once all have read their slices.
    const std::size_t n = static_cast<std::size_t>(size()), r = static_cast<std::size_t>(rank_);
    const std::size_t begin = count * r / n, end = count * (r + 1) / n, bytes = (end - begin) * dtype_size(dtype);
    Scratch slice(device_->allocator(), std::max<std::size_t>(bytes, 1));
    reduce_slice(slice.data(), begin, end - begin, dtype, op);
    group_->step(rank_);  // every send buffer has been read
    for (int q = 0; q < size(); ++q) device_->kernels().copy_bytes(comm::element_at(group_->recv(q), begin, dtype), slice.data(), bytes);
    leave();
  }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    record(CollectiveKind::all_gather, count * dtype_size(dtype));
    join(signature_of(call, CollectiveKind::all_gather, dtype, count), send, recv);
    for (int r = 0; r < size(); ++r)
      device_->kernels().copy_bytes(comm::element_at(recv, count * static_cast<std::size_t>(r), dtype), group_->send(r), count * dtype_size(dtype));
    leave();
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) override {
    record(CollectiveKind::reduce_scatter, count * static_cast<std::size_t>(size()) * dtype_size(dtype));
    join(signature_of(call, CollectiveKind::reduce_scatter, dtype, count, static_cast<int>(op)), send, recv);
    reduce_slice(recv, count * static_cast<std::size_t>(rank_), count, dtype, op);
    leave();
  }

  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    record(CollectiveKind::all_to_all, count * static_cast<std::size_t>(size()) * dtype_size(dtype));
    join(signature_of(call, CollectiveKind::all_to_all, dtype, count), send, recv);
    for (int r = 0; r < size(); ++r)
      device_->kernels().copy_bytes(comm::element_at(recv, count * static_cast<std::size_t>(r), dtype),
                                    comm::element_at(group_->send(r), count * static_cast<std::size_t>(rank_), dtype), count * dtype_size(dtype));
    leave();
  }

  void permute(const void* send, void* recv, std::size_t count, DType dtype, const std::vector<std::pair<int, int>>& pairs,
               const Call& call) override {
    check_permute_pairs(pairs, size(), "permute", group_->label());
    record(CollectiveKind::permute, count * dtype_size(dtype));
    join(signature_of(call, CollectiveKind::permute, dtype, count, 0, hash_pairs(pairs)), send, recv);
    auto source = std::find_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.second == rank_; });
    if (source == pairs.end()) device_->kernels().fill(dtype, recv, static_cast<std::int64_t>(count), 0.0);
    else device_->kernels().copy_bytes(recv, group_->send(source->first), count * dtype_size(dtype));
    leave();
  }

  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call) override {
    if (root < 0 || root >= size()) fail("broadcast", "root {} is out of range for a group of {} ranks", root, size());
    record(CollectiveKind::broadcast, count * dtype_size(dtype));
    join(signature_of(call, CollectiveKind::broadcast, dtype, count, root), send, recv);
    if (rank_ != root || send != recv) device_->kernels().copy_bytes(recv, group_->send(root), count * dtype_size(dtype));
    leave();
  }

  void barrier(const Call& call) override {
    record(CollectiveKind::barrier, 0);
    join(signature_of(call, CollectiveKind::barrier, DType::f32, 0), nullptr, nullptr);
  }

 private:
  // Drains the stream, publishes this rank's buffers and waits for the group.
  void join(const Signature& sig, const void* send, void* recv) {
    device_->kernels().synchronize();
    group_->arrive(rank_, sig, send, recv);
  }

  // Drains the stream and waits for all.
  void leave() {
    device_->kernels().synchronize();
    group_->step(rank_);
  }

  // dst (this device) = the ranks' elements [offset, offset + count) of the send buffers, reduced
  // in rank order (every rank gets the same bits).
  void reduce_slice(void* dst, std::size_t offset, std::size_t count, DType dtype, ReduceOp op) {
    if (count == 0) return;
    kernels::Kernels& k = device_->kernels();
    const std::size_t bytes = count * dtype_size(dtype);
    Scratch peer(device_->allocator(), bytes);
    k.copy_bytes(dst, comm::element_at(group_->send(0), offset, dtype), bytes);
    for (int r = 1; r < size(); ++r) {
      k.copy_bytes(peer.data(), comm::element_at(group_->send(r), offset, dtype), bytes);
      k.accumulate(op, dtype, dst, peer.data(), count);
    }
    k.synchronize();  // before `peer` goes back to the allocator
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::shared_ptr<Device> device_;
};

}  // namespace

std::unique_ptr<Communicator> make_device_communicator(std::shared_ptr<LocalGroup> group, int rank, std::shared_ptr<Device> device) {
  return std::make_unique<DeviceCommunicator>(std::move(group), rank, std::move(device));
}

}  // namespace nax::local
