#include "comm/mpi/mpi_session.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "nax/core/error.h"

namespace nax::mpi {

bool active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

void check(int code, std::string_view op) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(op, "MPI error: {}", std::string_view(text, static_cast<std::size_t>(length)));
}

Session::Session() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) fail("Runtime::mpi", "MPI was already finalized in this process");
    int provided = 0;
    // Serialized: per-shard code runs on the thread that calls Runtime::run, which may not be the
    // thread that initialised MPI.
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    owns_ = true;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &exit_comm_), "MPI_Comm_dup");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

Session::~Session() {
  if (!owns_ || !active()) return;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(exit_comm_, &request);
  const auto start = std::chrono::steady_clock::now();
  for (int done = 0; done == 0;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > exit_timeout_s_) {
      std::fprintf(stderr, "nax: process %d: the other processes did not reach the end of the program within %g s "
                   "(NAX_COLLECTIVE_TIMEOUT_S); aborting the MPI job\n", rank_, exit_timeout_s_);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  MPI_Comm_free(&exit_comm_);
  MPI_Finalize();
}

Session& Session::get() {
  static Session session;
  return session;
}

}  // namespace nax::mpi
