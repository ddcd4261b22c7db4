#include "comm/mpi/mpi_clock.h"

#include <limits>
#include <string>
#include <vector>

#include "comm/mpi/mpi_session.h"
#include "nax/trace/trace.h"

namespace nax::mpi {

namespace {

constexpr int kRounds = 8;
constexpr int kPingTag = 0, kResultTag = 1;

std::string processor_name() {
  std::vector<char> name(MPI_MAX_PROCESSOR_NAME + 1, '\0');
  int length = 0;
  check(MPI_Get_processor_name(name.data(), &length), "MPI_Get_processor_name");
  return std::string(name.data(), static_cast<std::size_t>(length));
}

// On process 0: the offset of `peer`'s clock, from the fastest of kRounds round trips.
std::int64_t time_peer(MPI_Comm comm, int peer) {
  std::int64_t best_round_trip = std::numeric_limits<std::int64_t>::max(), best = 0;
  for (int k = 0; k < kRounds; ++k) {
    const std::int64_t sent = trace::clock_ns();
    check(MPI_Send(&sent, 1, MPI_INT64_T, peer, kPingTag, comm), "MPI_Send");
    std::int64_t peer_time = 0;
    check(MPI_Recv(&peer_time, 1, MPI_INT64_T, peer, kPingTag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
    const std::int64_t received = trace::clock_ns();
    if (received - sent < best_round_trip) {
      best_round_trip = received - sent;
      best = peer_time - (sent + received) / 2;
    }
  }
  return best;
}

}  // namespace

ClockOffset clock_offset_to_process0(MPI_Comm world) {
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_dup(world, &comm), "MPI_Comm_dup");  // its own traffic, apart from collectives
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ClockOffset result;
  const std::string mine = processor_name();
  std::vector<char> root(MPI_MAX_PROCESSOR_NAME + 1, '\0');
  if (rank == 0) mine.copy(root.data(), mine.size());
  check(MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_CHAR, 0, comm), "MPI_Bcast");
  result.same_host = mine == std::string(root.data());
  if (rank == 0) {
    for (int peer = 1; peer < size; ++peer) {
      const std::int64_t offset = time_peer(comm, peer);
      check(MPI_Send(&offset, 1, MPI_INT64_T, peer, kResultTag, comm), "MPI_Send");
    }
  } else {
    for (int k = 0; k < kRounds; ++k) {
      std::int64_t ping = 0;
      check(MPI_Recv(&ping, 1, MPI_INT64_T, 0, kPingTag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
      const std::int64_t now = trace::clock_ns();
      check(MPI_Send(&now, 1, MPI_INT64_T, 0, kPingTag, comm), "MPI_Send");
    }
    check(MPI_Recv(&result.measured_ns, 1, MPI_INT64_T, 0, kResultTag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  MPI_Comm_free(&comm);
  return result;
}

}  // namespace nax::mpi
