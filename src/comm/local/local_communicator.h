#pragma once
// The thread communicator: ranks are threads of one process. Every collective rendezvouses in a
// LocalGroup, where each rank publishes its buffer pointers, then reads its peers' buffers
// directly (no staging copy). Started collectives run in the order started on a worker thread of
// the communicator (CommWorker); a blocking one first waits for those, so that each rank's calls
// reach the group in one order.
#include <memory>

#include "comm/local/local_world.h"
#include "nax/comm/communicator.h"

namespace nax::local {

// Rank `rank` of `group`.
std::unique_ptr<Communicator> make_local_communicator(std::shared_ptr<LocalGroup> group, int rank);

}  // namespace nax::local
