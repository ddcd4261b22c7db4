// The registry of backend components (components.h) and the core's entry points that forward to
// them. NAX_CUDA_BUILT / NAX_MPI_BUILT say whether this build has the component at all, so that
// the error tells a user to link it or to rebuild nax with it.
#include "runtime/components.h"

#include <optional>

#include "nax/core/error.h"
#include "runtime/runtime_state.h"

namespace nax::detail {

namespace {

std::optional<CudaComponent>& cuda_slot() {
  static std::optional<CudaComponent> slot;
  return slot;
}

std::optional<MpiComponent>& mpi_slot() {
  static std::optional<MpiComponent> slot;
  return slot;
}

std::string mpi_unavailable_reason() {
  if (NAX_MPI_BUILT)
    return "this program does not link the MPI backend: link nax::mpi (find_package(nax COMPONENTS mpi))";
  return "nax was built without MPI (NAX_WITH_MPI=OFF, or CMake found no MPI); install OpenMPI (scripts/setup.sh) and "
         "reconfigure, or use Runtime::local";
}

const CudaComponent& cuda(std::string_view what) {
  if (!cuda_slot()) fail(what, "{}", cuda_unavailable_reason());
  return *cuda_slot();
}

}  // namespace

void register_component(const CudaComponent& cuda) { cuda_slot() = cuda; }
void register_component(const MpiComponent& mpi) { mpi_slot() = mpi; }

std::string cuda_unavailable_reason() {
  if (NAX_CUDA_BUILT)
    return "this program does not link the CUDA backend: link nax::cuda (find_package(nax COMPONENTS cuda))";
  return "nax was built without the CUDA backend (NAX_WITH_CUDA=OFF, or CMake found no CUDA toolkit with NCCL); install "
         "the toolkit and reconfigure, or use the cpu backend";
}

bool cuda_built() { return cuda_slot().has_value(); }
int cuda_gpu_count() { return cuda_slot() ? cuda_slot()->gpu_count() : 0; }
std::shared_ptr<Device> make_cuda_device(int index, int gpu) { return cuda("cuda device").make_device(index, gpu); }
int gpu_of(const Device& device) { return cuda("cuda device").gpu_of(device); }
std::shared_ptr<NcclIds> make_nccl_ids() { return cuda("NCCL").make_nccl_ids(); }
std::string new_nccl_id() { return cuda("NCCL").new_nccl_id(); }
std::unique_ptr<Communicator> make_nccl_communicator(const std::string& id, int size, int rank, const Device& device,
                                                     const NcclGuardOptions& guard) {
  return cuda("NCCL").make_nccl_communicator(id, size, rank, device, guard);
}

}  // namespace nax::detail

namespace nax {

Runtime Runtime::mpi(const Mesh& mesh, RuntimeOptions options) {
  const auto& mpi = detail::mpi_slot();
  if (!mpi) fail("Runtime::mpi", "mesh {} cannot run one process per device: {}", mesh.str(), detail::mpi_unavailable_reason());
  return Runtime(mpi->make_runtime(mesh, detail::with_environment(std::move(options))));
}

int process_index() { return detail::mpi_slot() ? detail::mpi_slot()->process_index() : 0; }
int process_count() { return detail::mpi_slot() ? detail::mpi_slot()->process_count() : 1; }

}  // namespace nax
