#pragma once
// The CUDA side of the runtimes: devices on GPUs and NCCL communicators for their groups. The core
// library defines these (components.cpp) by forwarding to the CUDA component when a program links
// nax::cuda (cuda_devices.cpp implements them there), and raises an error saying so otherwise.
#include <memory>
#include <string>
#include <vector>

#include "nax/comm/communicator.h"
#include "nax/kernels/device.h"

namespace nax::detail {

// Whether this program links the CUDA backend, and the GPUs this process sees (0 without either).
bool cuda_built();
int cuda_gpu_count();

// Mesh device `index` on GPU `gpu`: its own stream, kernels and caching allocator. Several mesh
// devices may share one GPU (virtual devices).
std::shared_ptr<Device> make_cuda_device(int index, int gpu);

// The GPU a CUDA device runs on.
int gpu_of(const Device& device);

// The ncclUniqueIds of a process's groups: the first member to ask for `group` makes it, the
// others get the same one (threads of one process).
class NcclIds {
 public:
  virtual ~NcclIds() = default;
  virtual std::string id(const std::string& group) = 0;  // the id's bytes
};
std::shared_ptr<NcclIds> make_nccl_ids();
std::string new_nccl_id();  // a fresh ncclUniqueId's bytes (under MPI: made by a group's rank 0)

// How an NCCL communicator reports failures (comm/nccl_guard.h): the group's name and mesh devices
// for messages, the collective timeout, and whether ranks compare signatures before each collective.
struct NcclGuardOptions {
  std::string label;
  std::vector<int> devices;
  double timeout_s = 300;
  bool check_collectives = true;
};

// This device's NCCL communicator in a group of `size` ranks, from the group's id (as NcclIds or
// an MPI broadcast hands it out). Collectives are enqueued on the device's compute stream.
std::unique_ptr<Communicator> make_nccl_communicator(const std::string& id, int size, int rank, const Device& device,
                                                     const NcclGuardOptions& guard);

}  // namespace nax::detail
