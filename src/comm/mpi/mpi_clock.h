#pragma once
// The offset of this process's trace clock to process 0's, so that per-rank traces of a run over
// several hosts line up (the processes of one host share CLOCK_MONOTONIC already).
#include <mpi.h>

#include <cstdint>

namespace nax::mpi {

struct ClockOffset {
  std::int64_t measured_ns = 0;  // this process's clock minus process 0's (0 on process 0)
  bool same_host = true;         // on process 0's host (by MPI_Get_processor_name)
};

// Collective over `world`: process 0 times a few round trips to every other process and keeps,
// for each, the estimate of the round trip that took least time (its error is at most half of it).
ClockOffset clock_offset_to_process0(MPI_Comm world);

}  // namespace nax::mpi
