#pragma once
// What the communicators of one MPI runtime share: the mesh, this process's device, a duplicate of
// MPI_COMM_WORLD to build group communicators on, the control channel, and the wait that turns a
// collective which cannot complete into an error instead of a hang.
#include <mpi.h>

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/mpi/mpi_comm_handle.h"
#include "comm/mpi/mpi_control.h"
#include "nax/core/error.h"
#include "nax/core/mesh.h"

namespace nax::mpi {

// Raised on the devices released because another device failed.
class Aborted : public Error {
 public:
  using Error::Error;
};

// What a wait is for, to name it in errors and to tell when a peer will never join.
struct Pending {
  const std::string& group_key;    // the group's mesh axes, "dp,mp"
  const std::vector<int>& members;  // its devices, in rank order
  std::size_t call = 0;             // this is call number `call` (from 1) on the group
  const std::function<std::string()>& describe;  // "psum(...) [all_reduce(sum, f32 x 4)] on device 0 in ..."
};

class MpiWorld {
 public:
  // `host_tensors`: the devices keep their tensors in host memory (the cpu backend).
  MpiWorld(Mesh mesh, double timeout_s, bool check_collectives, bool host_tensors);
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  const Mesh& mesh() const { return mesh_; }
  int device() const { return device_; }
  double timeout_s() const { return timeout_s_; }
  bool check_collectives() const { return check_collectives_; }
  Control& control() { return control_; }

  // A communicator over `members` (devices in rank order), made once every member has asked for
  // it: collective over the members only, so groups that never talk never have to meet.
  MPI_Comm create_group_comm(const std::vector<int>& members, const std::string& key, const std::string& label);

  // Waits for every request to complete. Throws Aborted when another device failed, and an Error
  // when a member of the group ended its run without making this call, or on timeout; the
  // requests then stay pending for good (left_pending()), so MPI may still write their buffers:
  // the caller must keep them alive. With `finish_on_abort` (every member is known to have posted
  // its part, as after the signature check), an abort waits for the requests to complete first,
  // so that nothing is left pending.
  void wait(std::span<MPI_Request> requests, const Pending& pending, bool finish_on_abort = false);
  // Polls `done` until it is true, with the same checks. An abort releases it at once and leaves
  // nothing of MPI's pending (the runtime goes on); a timeout or a member that ended without the
  // call leave the run unusable, as for requests.
  void wait_until(const std::function<bool()>& done, const Pending& pending);
  // Throws Aborted (before anything is started) when another device has failed.
  void check_not_aborting(const Pending& pending);
  bool left_pending() const { return left_pending_; }

 private:
  // `requests`: MPI requests are behind `done` (left pending when the wait gives up).
  void poll_until(const std::function<bool()>& done, const Pending& pending, bool finish_on_abort, bool requests);
  [[noreturn]] void fail_waiting(const Pending& pending, const std::string& why);
  // A member of the group that ended its run with fewer calls on the group than `pending.call`.
  int member_that_ended_without(const Pending& pending) const;

  Mesh mesh_;
  int device_;
  double timeout_s_;
  bool check_collectives_;
  CommHandle parent_;
  Control control_;
  bool left_pending_ = false;
};

}  // namespace nax::mpi
