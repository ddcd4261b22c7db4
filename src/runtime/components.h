#pragma once
// The backends a program linked. The CUDA and MPI backends are libraries of their own (nax_cuda,
// nax_mpi; targets nax::cuda and nax::mpi) that register their entry points here when a program
// links them (runtime/cuda_component.cpp, runtime/mpi_component.cpp), so that the core library
// names neither CUDA nor MPI and a CPU-only program loads neither. Without a component, its entry
// points raise an error saying which target to link.
#include <memory>
#include <string>

#include "nax/comm/communicator.h"
#include "nax/kernels/device.h"
#include "nax/runtime/runtime.h"
#include "runtime/cuda_devices.h"

namespace nax::detail {

struct CudaComponent {
  int (*gpu_count)();
  std::shared_ptr<Device> (*make_device)(int index, int gpu);
  int (*gpu_of)(const Device& device);
  std::shared_ptr<NcclIds> (*make_nccl_ids)();
  std::string (*new_nccl_id)();
  std::unique_ptr<Communicator> (*make_nccl_communicator)(const std::string& id, int size, int rank, const Device& device,
                                                          const NcclGuardOptions& guard);
};

struct MpiComponent {
  std::unique_ptr<Runtime::State> (*make_runtime)(const Mesh& mesh, const RuntimeOptions& options);
  int (*process_index)();
  int (*process_count)();
};

void register_component(const CudaComponent& cuda);
void register_component(const MpiComponent& mpi);

// Why the CUDA backend cannot be used in this program (it is not linked, or nax was built without it).
std::string cuda_unavailable_reason();

}  // namespace nax::detail
