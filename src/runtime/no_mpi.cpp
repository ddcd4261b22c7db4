// Built instead of mpi_runtime.cpp when nax is configured with NAX_WITH_MPI=OFF.
#include "runtime/runtime_state.h"

namespace nax {

Runtime Runtime::mpi(const Mesh& mesh, RuntimeOptions) {
  fail("Runtime::mpi", "nax was built without MPI (NAX_WITH_MPI=OFF, or CMake found no MPI), so mesh {} cannot run one process per "
       "device; install OpenMPI (scripts/setup.sh) and reconfigure, or use Runtime::local",
       mesh.str());
}

int process_index() { return 0; }
int process_count() { return 1; }

}  // namespace nax
