#pragma once
// Owns an MPI communicator: frees it on destruction, unless MPI is gone or the communicator was
// abandoned with an operation that will never complete (freeing it then could wait forever).
#include <mpi.h>

#include <utility>

#include "comm/mpi/mpi_session.h"

namespace nax::mpi {

class CommHandle {
 public:
  CommHandle() = default;
  explicit CommHandle(MPI_Comm comm) : comm_(comm) {}
  CommHandle(CommHandle&& o) noexcept : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), abandoned_(o.abandoned_) {}
  CommHandle& operator=(CommHandle&& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(abandoned_, o.abandoned_);
    return *this;
  }
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle() {
    if (comm_ != MPI_COMM_NULL && !abandoned_ && active()) MPI_Comm_free(&comm_);
  }

  MPI_Comm get() const { return comm_; }
  void abandon() { abandoned_ = true; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool abandoned_ = false;
};

}  // namespace nax::mpi
