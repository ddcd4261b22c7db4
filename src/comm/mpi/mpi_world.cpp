#include "comm/mpi/mpi_world.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "comm/mpi/mpi_single_copy.h"
#include "core/shared_host_memory.h"

namespace nax::mpi {

namespace {

using Clock = std::chrono::steady_clock;

// A duplicate of `comm`, made without blocking past `timeout_s`: a process that never comes (it
// failed before making its runtime) is an error here, not a hang.
MPI_Comm duplicate(MPI_Comm comm, double timeout_s) {
  MPI_Comm out = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Comm_idup(comm, &out, &request), "MPI_Comm_idup");
  const auto start = Clock::now();
  for (int done = 0; done == 0;) {
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done == 0 && std::chrono::duration<double>(Clock::now() - start).count() > timeout_s)
      fail("Runtime::mpi", "not every process made its runtime within {:g} s (NAX_COLLECTIVE_TIMEOUT_S): did one fail or exit first?",
           timeout_s);
    if (done == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // Errors come back as codes (made into nax::Error by check) instead of aborting the job.
  check(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return out;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// A tag per group, so that creations of different groups between the same processes never match.
int tag_of(const std::string& key) { return 16 + static_cast<int>(std::hash<std::string>{}(key) % 16384); }

// Polling without hogging a core another process may need: spin briefly (lowest latency when
// every process has a core), then yield, then sleep a little between polls.
class Backoff {
 public:
  void pause() {
    const double waited = std::chrono::duration<double>(Clock::now() - start_).count();
    if (waited < 50e-6) return;
    if (waited < 2e-3) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  double waited_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_ = Clock::now();
};

// How often (in polls of the requests) the control channel and the clock are looked at.
constexpr std::uint64_t kControlEvery = 32;

// Whether other processes of the job run on this host and every one of them can map this one's
// files (collective over `comm`; Yama's ptrace scope, for one, can forbid it).
bool host_shares_files(MPI_Comm comm) {
  MPI_Comm local = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  int size = 1;
  MPI_Comm_size(local, &size);
  const bool shares = size > 1 && SingleCopy::peers_can_map(local);
  MPI_Comm_free(&local);
  return shares;
}

}  // namespace

MpiWorld::MpiWorld(Mesh mesh, double timeout_s, bool check_collectives, bool host_tensors)
    : mesh_(std::move(mesh)), device_(world_rank()), timeout_s_(timeout_s), check_collectives_(check_collectives),
      parent_(duplicate(MPI_COMM_WORLD, timeout_s)), control_(parent_.get(), device_, mesh_.size()) {
  // Every process is here (the duplicate waited for them): the collectives below cannot hang.
  // Large host tensors made from now on are ones the single-copy collectives can read in place
  // (on the cuda backend the tensors are on the GPUs: nothing to share).
  if (host_tensors && SingleCopy::wanted() && host_shares_files(parent_.get())) shared_host_memory::enable();
}

MPI_Comm MpiWorld::create_group_comm(const std::vector<int>& members, const std::string& key, const std::string& label) {
  // Every member tells every other one that it is here; MPI_Comm_create_group (blocking) only
  // starts once all have, so that a member that never comes is an error, not a hang.
  const int tag = tag_of(key);
  std::vector<MPI_Request> requests;
  // The tokens' buffers outlive a failed wait: MPI may still write them.
  auto tokens = std::make_unique<char[]>(members.size() + 1);
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] == device_) continue;
    check(MPI_Irecv(&tokens[i], 1, MPI_CHAR, members[i], tag, parent_.get(), &requests.emplace_back()), "MPI_Irecv");
    check(MPI_Isend(&tokens[members.size()], 1, MPI_CHAR, members[i], tag, parent_.get(), &requests.emplace_back()), "MPI_Isend");
  }
  const std::function<std::string()> describe = [&] { return fmt::format("creating the communicator of {} on device {}", label, device_); };
  try {
    wait(requests, Pending{key, members, 1, describe});
  } catch (...) {
    static_cast<void>(tokens.release());
    throw;
  }

  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(parent_.get(), &world_group);
  MPI_Group_incl(world_group, static_cast<int>(members.size()), members.data(), &group);
  MPI_Comm comm = MPI_COMM_NULL;
  const int code = MPI_Comm_create_group(parent_.get(), group, tag, &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  check(code, "MPI_Comm_create_group");
  return comm;
}

void MpiWorld::check_not_aborting(const Pending& pending) {
  if (left_pending_) throw Aborted(fmt::format("{}: not started, an earlier collective of this run failed", pending.describe()));
  control_.poll();
  if (control_.aborting())
    throw Aborted(fmt::format("{}: not started, the run is aborting: {}", pending.describe(), control_.abort_reason()));
}

int MpiWorld::member_that_ended_without(const Pending& pending) const {
  for (const auto& [device, ended] : control_.ended()) {
    if (std::find(pending.members.begin(), pending.members.end(), device) == pending.members.end()) continue;
    auto it = ended.calls.find(pending.group_key);
    if ((it == ended.calls.end() ? 0 : it->second) < pending.call) return device;
  }
  return -1;
}

void MpiWorld::fail_waiting(const Pending& pending, const std::string& why) {
  left_pending_ = true;
  throw Error(fmt::format("{} {}", pending.describe(), why));
}

void MpiWorld::wait(std::span<MPI_Request> requests, const Pending& pending, bool finish_on_abort) {
  poll_until(
      [&] {
        int done = 0;
        check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
        return done != 0;
      },
      pending, finish_on_abort, true);
}

void MpiWorld::wait_until(const std::function<bool()>& done, const Pending& pending) { poll_until(done, pending, false, false); }

void MpiWorld::poll_until(const std::function<bool()>& done, const Pending& pending, bool finish_on_abort, bool requests) {
  Backoff backoff;
  auto released = [&](std::string_view how) {
    return Aborted(fmt::format("{}: {} because the run is aborting: {}", pending.describe(), how, control_.abort_reason()));
  };
  for (std::uint64_t polls = 0;; ++polls) {
    if (done()) {
      if (finish_on_abort && control_.aborting()) throw released("released after it completed");
      return;
    }
    if (polls % kControlEvery == kControlEvery - 1) {
      control_.poll();
      if (control_.aborting() && !finish_on_abort) {
        left_pending_ = left_pending_ || requests;
        throw released("released");
      }
      if (int device = member_that_ended_without(pending); device >= 0)
        fail_waiting(pending, fmt::format("cannot complete: device {} finished its program without calling it", device));
      if (backoff.waited_s() > timeout_s_)
        fail_waiting(pending, fmt::format("timed out after {:g} s (NAX_COLLECTIVE_TIMEOUT_S); MPI cannot tell which of devices [{}] "
                                          "have not arrived",
                                          timeout_s_, fmt::join(pending.members, ",")));
    }
    backoff.pause();
  }
}

}  // namespace nax::mpi
