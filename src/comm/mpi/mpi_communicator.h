#pragma once
// The MPI communicator: one group of devices (one per process) over a set of mesh axes, ranked
// row-major over those axes like Mesh::group. Collectives are MPI's non-blocking ones, waited for
// by MpiWorld::wait (aborts, peers that finished, timeouts), or, for large ones between processes
// of one host, the single-copy path (mpi_single_copy.h). Before each collective the group agrees
// on its signature (one small all-gather of hashes) unless the runtime's check_collectives is off
// (a single-copy call still gathers the buffers' addresses): ranks that disagree raise the same
// error, naming both calls, on every rank of the group, as the local communicator does.
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_world.h"
#include "nax/comm/communicator.h"

namespace nax::mpi {

// This device's communicator of the group over `mesh_axes`.
std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<MpiWorld> world, const std::vector<std::string>& mesh_axes);

}  // namespace nax::mpi
