// CUDA devices for the runtimes: one CudaKernels (stream, cuBLASLt, scratch) and one caching
// allocator per mesh device; NCCL communicators on the device's compute stream, so collectives are
// ordered with the kernels around them without any host synchronisation.
#include "runtime/cuda_devices.h"
#include "runtime/components.h"

#include <nccl.h>

#include <cstring>
#include <map>
#include <mutex>

#include "comm/nccl/nccl_communicator.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_kernels.h"
#include "nax/core/error.h"

namespace nax::detail::cuda_impl {

int cuda_gpu_count() { return cuda::cuda_device_count(); }

std::shared_ptr<Device> make_cuda_device(int index, int gpu) {
  const int gpus = cuda_gpu_count();
  if (gpu < 0 || gpu >= gpus) fail("cuda device", "device {} asks for GPU {}, but this process sees {} GPU(s)", index, gpu, gpus);
  return std::make_shared<Device>(index, Backend::cuda, cuda::make_caching_device_allocator(gpu), std::make_shared<cuda::CudaKernels>(gpu));
}

const cuda::CudaKernels& cuda_kernels_of(const Device& device) {
  const auto* kernels = dynamic_cast<const cuda::CudaKernels*>(&device.kernels());
  if (kernels == nullptr) fail("cuda device", "{} is not a CUDA device", device.str());
  return *kernels;
}

int gpu_of(const Device& device) { return cuda_kernels_of(device).gpu(); }

std::string new_nccl_id();

class ProcessNcclIds final : public NcclIds {
 public:
  std::string id(const std::string& group) override {
    std::lock_guard lock(mutex_);
    auto [it, fresh] = ids_.try_emplace(group);
    if (fresh) it->second = new_nccl_id();
    return it->second;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> ids_;
};

std::string new_nccl_id() {
  const ncclUniqueId made = cuda::make_nccl_id();
  return std::string(reinterpret_cast<const char*>(&made), sizeof made);
}

std::shared_ptr<NcclIds> make_nccl_ids() { return std::make_shared<ProcessNcclIds>(); }

std::unique_ptr<Communicator> make_nccl_communicator(const std::string& id, int size, int rank, const Device& device,
                                                     const NcclGuardOptions& guard) {
  ncclUniqueId unique{};
  if (id.size() != sizeof unique) fail("NCCL", "a group id of {} bytes (expected {})", id.size(), sizeof unique);
  std::memcpy(&unique, id.data(), sizeof unique);
  const cuda::CudaKernels& kernels = cuda_kernels_of(device);
  // Joining a group allocates (implicitly synchronising calls): with NCCL kernels of this device's
  // other groups still spinning on the stream, that can hang; drain the stream first.
  device.kernels().synchronize();
  auto comm = std::make_unique<cuda::NcclCommunicator>(unique, size, rank, kernels.gpu(), kernels.stream());
  comm->guard(guard.label, guard.devices, guard.timeout_s, guard.check_collectives);
  return comm;
}

}  // namespace nax::detail::cuda_impl

// Linking nax::cuda pulls this object in (the target's link options name nax_link_cuda_component,
// static libraries included), and loading it registers the CUDA backend with the runtime.
extern "C" void nax_link_cuda_component() {}

namespace {
const bool registered = (nax::detail::register_component(nax::detail::CudaComponent{
                             .gpu_count = nax::detail::cuda_impl::cuda_gpu_count,
                             .make_device = nax::detail::cuda_impl::make_cuda_device,
                             .gpu_of = nax::detail::cuda_impl::gpu_of,
                             .make_nccl_ids = nax::detail::cuda_impl::make_nccl_ids,
                             .new_nccl_id = nax::detail::cuda_impl::new_nccl_id,
                             .make_nccl_communicator = nax::detail::cuda_impl::make_nccl_communicator,
                         }),
                         true);
}  // namespace
