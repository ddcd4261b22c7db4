#include "comm/local/local_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "comm/element_at.h"
#include "comm/local/comm_worker.h"
#include "comm/rank_tree.h"
#include "kernels/cpu/kernels.h"
#include "nax/trace/trace.h"

namespace nax::local {

namespace {

// Above this many bytes written, results go out with non-temporal stores: they will not fit in
// the cache anyway, and streaming spares reading every destination line first.
constexpr std::size_t kStreamBytes = std::size_t{1} << 20;

void copy_out(void* dst, const void* src, std::size_t bytes, bool large) {
  if (large) cpu::stream_copy(dst, src, bytes);
  else std::memcpy(dst, src, bytes);
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string describe() const override { return "local " + group_->label(); }
  bool adds_in_rank_tree(CollectiveKind, std::size_t, DType) const override { return true; }  // reduce_block

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) override {
    worker_.drain();
    record(CollectiveKind::all_reduce, count * dtype_size(dtype));
    run_all_reduce(signature_of(call, CollectiveKind::all_reduce, dtype, count, static_cast<int>(op)), send, recv, count, 0, dtype, op,
                   false);
  }

  std::unique_ptr<Request> start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                            const Call& call) override {
    record(CollectiveKind::all_reduce, count * dtype_size(dtype));
    return started(signature_of(call, CollectiveKind::all_reduce, dtype, count, static_cast<int>(op)), call.ticket,
                   [=, this](const Signature& sig) { run_all_reduce(sig, send, recv, count, 0, dtype, op, true); });
  }

  // One rendezvous for all the parts: each rank publishes its list of part pointers as its send
  // buffer, and reduces its slice of the parts laid end to end, reading them where they are.
  bool reduces_parts() const override { return true; }

  void all_reduce_parts(const std::vector<const void*>& parts, void* recv, std::size_t count, DType dtype, ReduceOp op,
                        const Call& call) override {
    worker_.drain();
    record(CollectiveKind::all_reduce, parts.size() * count * dtype_size(dtype));
    run_all_reduce(parts_signature(call, parts.size(), count, dtype, op), parts.data(), recv, parts.size() * count, count, dtype, op, false);
  }

  std::unique_ptr<Request> start_all_reduce_parts(const std::vector<const void*>& parts, void* recv, std::size_t count, DType dtype,
                                                  ReduceOp op, const Call& call) override {
    record(CollectiveKind::all_reduce, parts.size() * count * dtype_size(dtype));
    return started(parts_signature(call, parts.size(), count, dtype, op), call.ticket,
                   [=, this](const Signature& sig) { run_all_reduce(sig, parts.data(), recv, parts.size() * count, count, dtype, op, true); });
  }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    worker_.drain();
    record(CollectiveKind::all_gather, count * dtype_size(dtype));
    run_all_gather(signature_of(call, CollectiveKind::all_gather, dtype, count), send, recv, count, dtype, false);
  }

  std::unique_ptr<Request> start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    record(CollectiveKind::all_gather, count * dtype_size(dtype));
    return started(signature_of(call, CollectiveKind::all_gather, dtype, count), call.ticket,
                   [=, this](const Signature& sig) { run_all_gather(sig, send, recv, count, dtype, true); });
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) override {
    worker_.drain();
    record(CollectiveKind::reduce_scatter, count * static_cast<std::size_t>(size()) * dtype_size(dtype));
    run_reduce_scatter(signature_of(call, CollectiveKind::reduce_scatter, dtype, count, static_cast<int>(op)), send, recv, count, dtype,
                       op, false);
  }

  std::unique_ptr<Request> start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                                const Call& call) override {
    record(CollectiveKind::reduce_scatter, count * static_cast<std::size_t>(size()) * dtype_size(dtype));
    return started(signature_of(call, CollectiveKind::reduce_scatter, dtype, count, static_cast<int>(op)), call.ticket,
                   [=, this](const Signature& sig) { run_reduce_scatter(sig, send, recv, count, dtype, op, true); });
  }

  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    worker_.drain();
    record(CollectiveKind::all_to_all, count * static_cast<std::size_t>(size()) * dtype_size(dtype));
    group_->arrive(rank_, signature_of(call, CollectiveKind::all_to_all, dtype, count), send, recv);
    for (int r = 0; r < size(); ++r)
      std::memcpy(comm::element_at(recv, count * static_cast<std::size_t>(r), dtype),
                  comm::element_at(group_->send(r), count * static_cast<std::size_t>(rank_), dtype), count * dtype_size(dtype));
    group_->step(rank_);
  }

  void permute(const void* send, void* recv, std::size_t count, DType dtype, const std::vector<std::pair<int, int>>& pairs,
               const Call& call) override {
    check_permute_pairs(pairs, size(), "permute", group_->label());
    worker_.drain();
    record(CollectiveKind::permute, count * dtype_size(dtype));
    run_permute(signature_of(call, CollectiveKind::permute, dtype, count, 0, hash_pairs(pairs)), send, recv, count, dtype, pairs, false);
  }

  std::unique_ptr<Request> start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                         const std::vector<std::pair<int, int>>& pairs, const Call& call) override {
    check_permute_pairs(pairs, size(), "permute", group_->label());
    record(CollectiveKind::permute, count * dtype_size(dtype));
    return started(signature_of(call, CollectiveKind::permute, dtype, count, 0, hash_pairs(pairs)), call.ticket,
                   [=, this](const Signature& sig) { run_permute(sig, send, recv, count, dtype, pairs, true); });
  }

  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call) override {
    if (root < 0 || root >= size()) fail("broadcast", "root {} is out of range for a group of {} ranks", root, size());
    worker_.drain();
    record(CollectiveKind::broadcast, count * dtype_size(dtype));
    group_->arrive(rank_, signature_of(call, CollectiveKind::broadcast, dtype, count, root), send, recv);
    if (rank_ != root || send != recv) std::memcpy(recv, group_->send(root), count * dtype_size(dtype));
    group_->step(rank_);
  }

  void barrier(const Call& call) override {
    worker_.drain();
    record(CollectiveKind::barrier, 0);
    group_->arrive(rank_, signature_of(call, CollectiveKind::barrier, DType::f32, 0), nullptr, nullptr);
  }

 private:
  // The collectives' rendezvous and data movement, after record(); `on_worker`: run by the worker,
  // which the deadlock search does not follow (the device's own thread waits in wait()).
  // `part` > 0: `send` is a list of parts of `part` elements, `count` in all (all_reduce_parts).
  void run_all_reduce(const Signature& sig, const void* send, void* recv, std::size_t count, std::size_t part, DType dtype, ReduceOp op,
                      bool on_worker) {
    group_->arrive(rank_, sig, send, recv, !on_worker);
    // Reduce-scatter and all-gather in one pass: this rank reduces its 1/n slice and writes the
    // result straight into every rank's recv buffer, so each byte is read once and written once.
    const std::size_t n = static_cast<std::size_t>(size()), r = static_cast<std::size_t>(rank_);
    const std::size_t begin = count * r / n, end = count * (r + 1) / n;
    std::vector<void*> dsts;
    for (int q = 0; q < size(); ++q) dsts.push_back(comm::element_at(group_->recv(q), begin, dtype));
    reduce_block(dsts, begin, end - begin, dtype, op, part);
    group_->step(rank_);
  }

  // A call over parts has the signature of the all-reduce of their concatenation, told apart by
  // the number of parts (a rank that sends one buffer while another sends parts is out of step).
  static Signature parts_signature(const Call& call, std::size_t parts, std::size_t count, DType dtype, ReduceOp op) {
    return signature_of(call, CollectiveKind::all_reduce, dtype, parts * count, static_cast<int>(op), parts);
  }

  void run_all_gather(const Signature& sig, const void* send, void* recv, std::size_t count, DType dtype, bool on_worker) {
    group_->arrive(rank_, sig, send, recv, !on_worker);
    const bool large = count * dtype_size(dtype) * static_cast<std::size_t>(size()) >= kStreamBytes;
    for (int r = 0; r < size(); ++r)
      copy_out(comm::element_at(recv, count * static_cast<std::size_t>(r), dtype), group_->send(r), count * dtype_size(dtype), large);
    group_->step(rank_);
  }

  void run_reduce_scatter(const Signature& sig, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                          bool on_worker) {
    group_->arrive(rank_, sig, send, recv, !on_worker);
    reduce_block({recv}, count * static_cast<std::size_t>(rank_), count, dtype, op);
    group_->step(rank_);
  }

  void run_permute(const Signature& sig, const void* send, void* recv, std::size_t count, DType dtype,
                   const std::vector<std::pair<int, int>>& pairs, bool on_worker) {
    group_->arrive(rank_, sig, send, recv, !on_worker);
    auto source = std::find_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.second == rank_; });
    if (source == pairs.end()) std::memset(recv, 0, count * dtype_size(dtype));
    else std::memcpy(recv, group_->send(source->first), count * dtype_size(dtype));
    group_->step(rank_);
  }

  // Queues `run(sig)` on the worker with its own copy of the origin (the caller's may be gone by then).
  // Its transfer is a slice on the starting device's "transfers" track, beside the device's own.
  std::unique_ptr<Request> started(const Signature& sig, std::uint64_t ticket, std::function<void(const Signature&)> run) {
    return worker_.submit([sig, origin = sig.origin != nullptr ? *sig.origin : std::string(), run = std::move(run),
                           device = trace::thread_device(), ticket] {
      Signature own = sig;
      own.origin = &origin;
      trace::set_thread_transfers(device);
      const trace::Span transfer("collective", collective_name(sig.kind), [&] {
        return fmt::format("\"started\": {}, \"ticket\": {}, \"bytes\": {}", trace::quote(origin), ticket, sig.count * dtype_size(sig.dtype));
      });
      run(own);
    });
  }

  // Reduces the ranks' elements [offset, offset + count) of the send buffers into each of dsts.
  // With `part` (> 0) each rank's send is a list of parts of `part` elements laid end to end.
  void reduce_block(const std::vector<void*>& dsts, std::size_t offset, std::size_t count, DType dtype, ReduceOp op,
                    std::size_t part = 0) {
    // Reduce a cache-sized chunk at a time, the ranks in the halving tree (comm/rank_tree.h), so
    // that every rank gets the same bits and a destination may alias a send buffer (a chunk is
    // read before it is written).
    constexpr std::size_t kChunkBytes = 16384;
    const std::size_t es = dtype_size(dtype), chunk = kChunkBytes / es;
    const bool large = count * es * dsts.size() >= kStreamBytes;
    for (std::size_t begin = 0, n = 0; begin < count; begin += n) {
      const std::size_t at = offset + begin;
      n = std::min(chunk, count - begin);
      if (part > 0) n = std::min(n, part - at % part);  // a chunk stays within one part
      const void* sum = comm::reduce_ranks_in_tree(size(), n, dtype, op, tree_, nullptr, [&](int q, void*) -> const void* {
        if (part == 0) return comm::element_at(group_->send(q), at, dtype);
        return comm::element_at(static_cast<const void* const*>(group_->send(q))[at / part], at % part, dtype);
      });
      for (void* dst : dsts) copy_out(comm::element_at(dst, begin, dtype), sum, n * es, large);
    }
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  comm::RankTreeScratch tree_;  // used by one call at a time: blocking calls drain the worker first
  CommWorker worker_;  // last: joined before the rest goes
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(std::shared_ptr<LocalGroup> group, int rank) {
  return std::make_unique<LocalCommunicator>(std::move(group), rank);
}

}  // namespace nax::local
