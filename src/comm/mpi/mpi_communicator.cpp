#include "comm/mpi/mpi_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <span>

#include "comm/mpi/mpi_comm_handle.h"
#include "comm/mpi/mpi_single_copy.h"
#include "comm/mpi/mpi_types.h"
#include "comm/signature.h"
#include "nax/trace/trace.h"

namespace nax::mpi {

namespace {

// A signature as it travels when the group compares them after a mismatch.
struct WireSignature {
  std::int64_t kind, dtype, count, detail;
  std::uint64_t pairs_hash;
  std::uint64_t call_site;
};

// What each member tells the group before a collective: its call's signature hash and, for a
// single-copy call, where its buffers are.
struct Agreement {
  std::int64_t hash;
  SingleCopy::Buffers buffers;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiWorld> world, const std::vector<std::string>& mesh_axes)
      : world_(std::move(world)), key_(fmt::format("{}", fmt::join(mesh_axes, ","))),
        members_(world_->mesh().group(world_->device(), mesh_axes)),
        rank_(world_->mesh().rank_in_group(world_->device(), mesh_axes)),
        agreement_(std::make_unique<Agreements>(members_.size())) {
    label_ = fmt::format("group ({}) of devices [{}]", key_, fmt::join(members_, ","));
    comm_ = CommHandle(world_->create_group_comm(members_, key_, label_));
    check(MPI_Comm_set_errhandler(comm_.get(), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    const std::function<std::string()> describe = [this] {
      return fmt::format("the single-copy probe of {} on device {}", label_, world_->device());
    };
    // Call 0: a member may end its program once its part of the probe is in (every member is here,
    // as making the communicator ensured), so "ended without it" does not apply.
    auto wait = [&](std::span<MPI_Request> requests) { world_->wait(requests, Pending{key_, members_, 0, describe}); };
    single_copy_ = SingleCopy::probe(comm_.get(), rank_, size(), wait);
  }

  ~MpiCommunicator() override {
    if (!world_->left_pending()) return;
    comm_.abandon();
    static_cast<void>(agreement_.release());  // a pending check may still write it
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string describe() const override {
    return "mpi " + label_ + (single_copy_ != nullptr ? " (single copy on one host)" : "");
  }

  // The single-copy path adds in the rank tree; MPI's own reductions in their own order. The bytes
  // are the ones start_all_reduce and start_reduce_scatter decide by.
  bool adds_in_rank_tree(CollectiveKind kind, std::size_t count, DType dtype) const override {
    if (size() <= 2) return true;
    const std::size_t bytes = count * dtype_size(dtype) * (kind == CollectiveKind::reduce_scatter ? members_.size() : 1);
    return (kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter) && takes_single_copy(bytes);
  }

  // MPI's own non-blocking collectives, posted after the signature check (which waits for the
  // group) and waited for by the request as the blocking forms wait.
  std::unique_ptr<Request> start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                            const Call& call) override {
    const auto sig = signature_of(call, CollectiveKind::all_reduce, dtype, count, static_cast<int>(op));
    const std::size_t bytes = count * dtype_size(dtype);
    const auto direct = single_copy(bytes, send, bytes, recv, bytes);
    begin(CollectiveKind::all_reduce, bytes, sig, direct);
    if (direct)
      return run_single_copy(sig, [&](auto members, const auto& call) {
        single_copy_->all_reduce(members, count, dtype, op, call);
      });
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, count_of(count, "all_reduce"), datatype(dtype), reduce_op(op, dtype),
                         comm_.get(), requests.data()),
          "MPI_Iallreduce");
    return posted(std::move(requests), sig);
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) override {
    start_all_reduce(send, recv, count, dtype, op, call)->wait();
  }

  std::unique_ptr<Request> start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    const auto sig = signature_of(call, CollectiveKind::all_gather, dtype, count);
    const std::size_t bytes = count * dtype_size(dtype);
    const auto direct = single_copy(bytes * members_.size(), send, bytes, recv, bytes * members_.size());
    begin(CollectiveKind::all_gather, bytes, sig, direct);
    if (direct)
      return run_single_copy(sig, [&](auto members, const auto& call) { single_copy_->all_gather(members, count, dtype, call); });
    const int n = count_of(count, "all_gather");
    count_of(count * members_.size(), "all_gather");
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check(MPI_Iallgather(send, n, datatype(dtype), recv, n, datatype(dtype), comm_.get(), requests.data()), "MPI_Iallgather");
    return posted(std::move(requests), sig);
  }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    start_all_gather(send, recv, count, dtype, call)->wait();
  }

  std::unique_ptr<Request> start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                                const Call& call) override {
    const auto sig = signature_of(call, CollectiveKind::reduce_scatter, dtype, count, static_cast<int>(op));
    const std::size_t bytes = count * dtype_size(dtype);
    const auto direct = single_copy(bytes * members_.size(), send, bytes * members_.size(), recv, bytes);
    begin(CollectiveKind::reduce_scatter, bytes * members_.size(), sig, direct);
    if (direct)
      return run_single_copy(sig, [&](auto members, const auto& call) {
        single_copy_->reduce_scatter(members, count, dtype, op, call);
      });
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    check(MPI_Ireduce_scatter_block(send, recv, count_of(count, "reduce_scatter"), datatype(dtype), reduce_op(op, dtype), comm_.get(),
                                    requests.data()),
          "MPI_Ireduce_scatter_block");
    return posted(std::move(requests), sig);
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Call& call) override {
    start_reduce_scatter(send, recv, count, dtype, op, call)->wait();
  }

  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) override {
    const auto sig = signature_of(call, CollectiveKind::all_to_all, dtype, count);
    begin(CollectiveKind::all_to_all, count * members_.size() * dtype_size(dtype), sig);
    const int n = count_of(count, "all_to_all");
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoall(send, n, datatype(dtype), recv, n, datatype(dtype), comm_.get(), &request), "MPI_Ialltoall");
    wait({&request, 1}, sig, world_->check_collectives());
  }

  std::unique_ptr<Request> start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                         const std::vector<std::pair<int, int>>& pairs, const Call& call) override {
    check_permute_pairs(pairs, size(), "permute", label_);
    const auto sig = signature_of(call, CollectiveKind::permute, dtype, count, 0, hash_pairs(pairs));
    begin(CollectiveKind::permute, count * dtype_size(dtype), sig);
    const int n = count_of(count, "permute");
    const std::size_t bytes = count * dtype_size(dtype);
    std::vector<MPI_Request> requests;
    bool received = false;
    for (auto [src, dst] : pairs) {
      if (src == rank_ && dst == rank_) {
        std::memcpy(recv, send, bytes);
        received = true;
      } else if (src == rank_) {
        check(MPI_Isend(send, n, datatype(dtype), dst, 0, comm_.get(), &requests.emplace_back()), "MPI_Isend");
      } else if (dst == rank_) {
        check(MPI_Irecv(recv, n, datatype(dtype), src, 0, comm_.get(), &requests.emplace_back()), "MPI_Irecv");
        received = true;
      }
    }
    if (!received) std::memset(recv, 0, bytes);
    return posted(std::move(requests), sig);
  }

  void permute(const void* send, void* recv, std::size_t count, DType dtype, const std::vector<std::pair<int, int>>& pairs,
               const Call& call) override {
    start_permute(send, recv, count, dtype, pairs, call)->wait();
  }

  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root, const Call& call) override {
    if (root < 0 || root >= size()) fail("broadcast", "root {} is out of range for a group of {} ranks", root, size());
    const auto sig = signature_of(call, CollectiveKind::broadcast, dtype, count, root);
    begin(CollectiveKind::broadcast, count * dtype_size(dtype), sig);
    if (rank_ == root && send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(recv, count_of(count, "broadcast"), datatype(dtype), root, comm_.get(), &request), "MPI_Ibcast");
    wait({&request, 1}, sig, world_->check_collectives());
  }

  void barrier(const Call& call) override {
    const auto sig = signature_of(call, CollectiveKind::barrier, DType::f32, 0);
    begin(CollectiveKind::barrier, 0, sig);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_.get(), &request), "MPI_Ibarrier");
    wait({&request, 1}, sig, world_->check_collectives());
  }

 private:
  // A posted collective: what wait() needs after the communicator has moved on to other calls.
  class MpiRequest final : public Request {
   public:
    MpiRequest(MpiCommunicator& comm, std::vector<MPI_Request> requests, const CollectiveSignature& sig)
        : comm_(comm), requests_(std::move(requests)), origin_(sig.origin != nullptr ? *sig.origin : std::string()), sig_(sig),
          call_(total_calls(comm.stats())), agreed_(comm.world_->check_collectives()) {
      sig_.origin = &origin_;
    }
    ~MpiRequest() override {
      if (waited_) return;
      try {
        wait();
      } catch (...) {  // the owner is going away because of another error, or said nothing about it
      }
    }
    void wait() override {
      if (waited_) return;
      waited_ = true;
      const std::function<std::string()> describe = [&] { return comm_.describe_call(sig_); };
      comm_.world_->wait(requests_, Pending{comm_.key_, comm_.members_, call_, describe}, agreed_);
    }

   private:
    MpiCommunicator& comm_;
    std::vector<MPI_Request> requests_;
    std::string origin_;
    CollectiveSignature sig_;
    std::size_t call_;
    bool agreed_;
    bool waited_ = false;
  };

  std::unique_ptr<Request> posted(std::vector<MPI_Request> requests, const CollectiveSignature& sig) {
    return std::make_unique<MpiRequest>(*this, std::move(requests), sig);
  }

  bool takes_single_copy(std::size_t moved) const { return single_copy_ != nullptr && moved >= SingleCopy::kMinBytes; }

  // This member's buffers when a call moving `moved` bytes takes the single-copy path.
  std::optional<SingleCopy::Buffers> single_copy(std::size_t moved, const void* send, std::size_t send_bytes, const void* recv,
                                                 std::size_t recv_bytes) const {
    if (!takes_single_copy(moved)) return std::nullopt;
    return SingleCopy::own(send, send_bytes, recv, recv_bytes);
  }

  // Runs a single-copy collective to its end (it needs every member present, as the signature
  // check already did): the request it returns is complete. MPI's own non-blocking collectives
  // move data only inside MPI calls too, so no overlap is lost. Its barriers hold no buffers, so
  // an abort releases them at once.
  using SingleCopyRun = std::function<void(std::span<const SingleCopy::Buffers>, const SingleCopy::Call&)>;
  std::unique_ptr<Request> run_single_copy(const CollectiveSignature& sig, const SingleCopyRun& run) {
    std::vector<SingleCopy::Buffers> members;
    for (const Agreement& member : agreement_->all) members.push_back(member.buffers);
    const std::function<std::string()> describe = [&] { return describe_call(sig); };
    const std::size_t call = total_calls(stats());  // recorded by begin(): the same on every member
    const SingleCopy::Poll poll = [&](const std::function<bool()>& done) {
      world_->wait_until(done, Pending{key_, members_, call, describe});
    };
    run(members, SingleCopy::Call{call, poll});
    return posted({}, sig);
  }

  std::string describe_call(const CollectiveSignature& sig) const {
    return fmt::format("{} on device {} in {}", sig.str(), world_->device(), label_);
  }

  // Records the call, checks that no device failed, and agrees on the signature with the group.
  // With `buffers` (a single-copy call) the agreement also tells every member where the others'
  // buffers are, and happens even with the check off.
  void begin(CollectiveKind kind, std::size_t bytes, const CollectiveSignature& sig,
             const std::optional<SingleCopy::Buffers>& buffers = std::nullopt) {
    record(kind, bytes);
    const std::function<std::string()> describe = [&] { return describe_call(sig); };
    world_->check_not_aborting(Pending{key_, members_, total_calls(stats()), describe});
    if (!world_->check_collectives() && !buffers) return;
    // The signatures' agreement completes when the last peer arrives: the trace's wait for peers.
    const trace::Span waiting("wait", "wait for peers", [&] { return fmt::format("\"group\": {}", trace::quote(label_)); });
    // Equal signatures give equal hashes; every member sees every member's.
    Agreement& own = agreement_->own;
    own = {static_cast<std::int64_t>(sig.hash() >> 1), buffers.value_or(SingleCopy::Buffers{})};
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(&own, sizeof own, MPI_BYTE, agreement_->all.data(), sizeof own, MPI_BYTE, comm_.get(), &request),
          "MPI_Iallgather");
    wait({&request, 1}, sig, false);
    for (const Agreement& member : agreement_->all)
      if (member.hash != own.hash) throw Error(mismatch_message(sig));
  }

  // `agreed`: the group passed the signature check, so every member has posted its part.
  void wait(std::span<MPI_Request> requests, const CollectiveSignature& sig, bool agreed) {
    const std::function<std::string()> describe = [&] { return describe_call(sig); };
    world_->wait(requests, Pending{key_, members_, total_calls(stats()), describe}, agreed);
  }

  std::string mismatch_message(const CollectiveSignature& sig) {
    // Every rank of the group is here (they all saw the same extremes): gather what each called.
    const WireSignature wire{static_cast<std::int64_t>(sig.kind), static_cast<std::int64_t>(sig.dtype), static_cast<std::int64_t>(sig.count),
                             sig.detail, sig.pairs_hash, sig.call_site};
    std::vector<WireSignature> all(members_.size());
    check(MPI_Allgather(&wire, sizeof wire, MPI_BYTE, all.data(), sizeof wire, MPI_BYTE, comm_.get()), "MPI_Allgather");
    const std::string& origin = sig.origin != nullptr ? *sig.origin : std::string();
    const int length = static_cast<int>(origin.size());
    std::vector<int> lengths(members_.size()), offsets(members_.size());
    check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_.get()), "MPI_Allgather");
    int total = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) offsets[r] = std::exchange(total, total + lengths[r]);
    std::string origins(static_cast<std::size_t>(total), '\0');
    check(MPI_Allgatherv(origin.data(), length, MPI_CHAR, origins.data(), lengths.data(), offsets.data(), MPI_CHAR, comm_.get()),
          "MPI_Allgatherv");
    auto rank_signature = [&](std::size_t r, std::string& origin_text) {
      origin_text = origins.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r]));
      return CollectiveSignature{static_cast<CollectiveKind>(all[r].kind), static_cast<DType>(all[r].dtype), static_cast<std::size_t>(all[r].count),
                                 static_cast<int>(all[r].detail), all[r].pairs_hash, &origin_text, all[r].call_site};
    };
    std::string first_origin, other_origin;
    const CollectiveSignature first = rank_signature(0, first_origin);
    for (std::size_t r = 1; r < members_.size(); ++r) {
      const CollectiveSignature other = rank_signature(r, other_origin);
      if (!(other == first))
        return nax::mismatch_message(label_, members_[0], first, members_[r], other);
    }
    return fmt::format("collective mismatch in {}: the signatures' hashes differ but not the signatures", label_);
  }

  std::shared_ptr<MpiWorld> world_;
  std::string key_;    // "dp,mp"
  std::string label_;  // "group (dp,mp) of devices [0,1,2,3]"
  std::vector<int> members_;
  int rank_;
  CommHandle comm_;
  std::unique_ptr<SingleCopy> single_copy_;  // null when a member is on another host or unreadable
  // The signature check's buffers, this member's hash (and buffers) and every member's: on the
  // heap, so that they can outlive a check abandoned by a timeout or an abort (MPI may still use them).
  struct Agreements {
    explicit Agreements(std::size_t members) : all(members) {}
    Agreement own{};
    std::vector<Agreement> all;
  };
  std::unique_ptr<Agreements> agreement_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<MpiWorld> world, const std::vector<std::string>& mesh_axes) {
  return std::make_unique<MpiCommunicator>(std::move(world), mesh_axes);
}

}  // namespace nax::mpi
