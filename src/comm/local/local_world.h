#pragma once
// Shared state of the thread communicator: one LocalGroup per group of ranks (a set of mesh axes
// and a position on the others), plus the world-wide abort flag and per-device status that let a
// waiting rank fail fast instead of hanging.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/signature.h"
#include "nax/comm/communicator.h"
#include "nax/core/error.h"
#include "nax/core/mesh.h"

namespace nax::local {

using Signature = CollectiveSignature;

// Raised on the ranks released because another device failed.
class Aborted : public Error {
 public:
  using Error::Error;
};

class LocalWorld;

class LocalGroup {
 public:
  LocalGroup(LocalWorld& world, std::vector<int> members, std::string axes_label);

  int size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }
  const std::string& label() const { return label_; }

  // Publishes this rank's buffers and waits for every rank. Throws (on every rank) when the
  // signatures disagree, when the world aborts, when a peer finished its program, or on timeout.
  // `tracked`: the device's own thread waits (its status names this group, the deadlock search
  // follows it); a communicator's worker running a started collective is not tracked.
  void arrive(int rank, const Signature& sig, const void* send, void* recv, bool tracked = true);
  // A barrier between the steps of a collective that every rank has already joined.
  void step(int rank);

  const void* send(int rank) const { return slots_[static_cast<std::size_t>(rank)].send; }
  void* recv(int rank) const { return slots_[static_cast<std::size_t>(rank)].recv; }

  // Spins briefly until `counter` leaves `value`; true when it did.
  bool spin_until_changed(const std::atomic<std::uint64_t>& counter, std::uint64_t value) const;

  // What `device` (a member) is doing here, for messages; takes this group's lock.
  std::string waiting_status(int device);
  // The members `device` waits for here: those not arrived, when `device` has arrived in the
  // rendezvous under way (else none: it completed, or `device` is only about to arrive).
  std::vector<int> awaited_by(int device);

  void wake();   // wakes waiters to look at the world's state
  void reset();  // after a run: forget any half-finished rendezvous

 private:
  struct Slot {
    const void* send = nullptr;
    void* recv = nullptr;
    Signature sig;
    bool arrived = false;
  };
  [[noreturn]] void fail_waiting(std::unique_lock<std::mutex>& lock, int rank, const std::string& why);
  std::string mismatch_message() const;

  LocalWorld& world_;
  std::vector<int> members_;
  std::string label_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  int arrived_ = 0;
  std::atomic<int> stepped_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> step_generation_{0};
  bool spin_;  // every device has a core: a short spin beats sleeping on the condition variable
  std::string error_;  // set for the current generation when the signatures disagree
};

class LocalWorld {
 public:
  LocalWorld(Mesh mesh, double timeout_s);

  const Mesh& mesh() const { return mesh_; }
  double timeout_s() const { return timeout_s_; }
  std::shared_ptr<LocalGroup> group(int device, const std::vector<std::string>& axes);

  // Device status, for messages and to release waiters early. Setting it is lock-free: it
  // happens on every collective; the text is only built when a message needs it.
  void set_waiting(int device, LocalGroup* group) { waiting_in_[static_cast<std::size_t>(device)].store(group); }
  void set_running(int device) { waiting_in_[static_cast<std::size_t>(device)].store(nullptr); }
  void set_finished(int device);
  bool finished(int device) const { return finished_[static_cast<std::size_t>(device)].load(); }
  std::string status(int device) const;  // call without holding any group's lock
  // A cycle of devices each waiting, in a rendezvous of its own, for the next (the last for
  // `device`): a deadlock that no timeout needs to wait for. Empty when there is none. Call without
  // holding any group's lock.
  std::vector<int> wait_cycle(int device) const;

  void abort(const std::string& reason);  // releases every waiting rank
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;
  void reset();  // between runs

 private:
  Mesh mesh_;
  double timeout_s_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::vector<std::string>, int>, std::shared_ptr<LocalGroup>> groups_;
  std::vector<std::atomic<LocalGroup*>> waiting_in_;
  std::vector<std::atomic<bool>> finished_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
};

}  // namespace nax::local
