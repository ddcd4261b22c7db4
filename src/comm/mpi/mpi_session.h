#pragma once
// The process's MPI library: initialised on first use (unless the program already did it) and
// finalised at exit by whoever initialised it. nax calls MPI from one thread at a time.
// MPI_Finalize waits for every process; a process that exits early (an error the others did not
// have) would wait forever for peers stuck in a collective with it. So exit first waits, with a
// timeout, in a non-blocking barrier, and aborts the MPI job if the others do not come.
#include <mpi.h>

#include <algorithm>
#include <string_view>

namespace nax::mpi {

class Session {
 public:
  // The process-wide session; initialises MPI on the first call.
  static Session& get();

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // How long finalisation waits for the other processes: the longest collective timeout of the
  // runtimes made (RuntimeOptions::collective_timeout_s), 300 s before any.
  void set_exit_timeout(double seconds) { exit_timeout_s_ = std::max(exit_timeout_s_, seconds); }

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session();

 private:
  Session();
  bool owns_ = false;  // we called MPI_Init, so we call MPI_Finalize
  int rank_ = 0, size_ = 1;
  double exit_timeout_s_ = 300;
  MPI_Comm exit_comm_ = MPI_COMM_NULL;  // for that barrier alone, so that it matches nothing else
};

// True between MPI_Init and MPI_Finalize (by anyone): MPI objects may be freed only then.
bool active();

// Throws a nax::Error naming `op` and MPI's message when `code` is not MPI_SUCCESS.
void check(int code, std::string_view op);

}  // namespace nax::mpi
