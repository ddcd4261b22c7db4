#pragma once
// The MPI runtime's control channel: small messages between the processes about runs, on a
// communicator of its own so that they never mix with collectives. Two kinds:
//   abort: a device failed; the others stop waiting in their collectives and fail too;
//   ended: a device ended run `epoch` (how, whether it left an MPI operation pending, how many
//          collectives it called per group, and why it failed after its program returned), so that
//          a peer still waiting for it in a collective can tell that it never will, and every
//          process knows how the run ended everywhere.
// Messages are sent without blocking and received by poll(). Each names its run (epoch): a peer
// that has heard everyone end run N may already be in run N+1 while this process still finishes
// run N, so messages of a later run wait until this process gets there.
#include <mpi.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_comm_handle.h"

namespace nax::mpi {

// failed: raised while the program ran (the others are aborted); failed_late: raised after it
// returned (an unwaited start, an unused axis rule), when this device's collectives are complete,
// so that the others finish theirs and report the reason at the end of the run, leaving nothing
// pending; released: stopped by another device's abort.
enum class RunEnd { ok, failed, released, failed_late };

struct Ended {
  RunEnd end = RunEnd::ok;
  bool left_pending = false;
  std::map<std::string, std::size_t> calls;  // per group of mesh axes ("dp,mp")
  std::string reason;                          // for failed_late: the error
};

class Control {
 public:
  Control(MPI_Comm world, int device, int devices);
  ~Control();
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  // Starts run `epoch`: forgets the last run's messages, takes up those already received for it.
  void begin_run(std::uint64_t epoch);
  std::uint64_t epoch() const { return epoch_; }

  void send_abort(const std::string& reason);
  void send_ended(const Ended& ended);

  // Receives every message that has arrived.
  void poll();

  bool aborting() const { return !abort_reason_.empty(); }
  const std::string& abort_reason() const { return abort_reason_; }  // the first one received
  // The ended messages of the current epoch received so far, by device.
  const std::map<int, Ended>& ended() const { return ended_; }

 private:
  void send(std::string message);
  void receive(const std::string& message, int source);
  void reap_sends();

  CommHandle comm_;
  int device_, devices_;
  struct Outgoing {
    std::unique_ptr<std::string> text;  // its bytes must stay put while MPI sends them
    std::vector<MPI_Request> requests;
  };
  std::list<Outgoing> outgoing_;
  std::uint64_t epoch_ = 0;
  std::string abort_reason_;
  std::map<int, Ended> ended_;
  std::vector<std::pair<std::string, int>> later_;  // messages of later runs, with their sources
};

}  // namespace nax::mpi
