// Built instead of cuda_devices.cpp when nax is configured without the CUDA backend.
#include "runtime/cuda_devices.h"

#include "nax/core/error.h"

namespace nax::detail {

namespace {
[[noreturn]] void refuse(std::string_view what) {
  fail(what, "nax was built without the CUDA backend (NAX_WITH_CUDA=OFF, or CMake found no CUDA toolkit with NCCL); "
       "install the toolkit and reconfigure, or use the cpu backend");
}
}  // namespace

bool cuda_built() { return false; }
int cuda_gpu_count() { return 0; }
std::shared_ptr<Device> make_cuda_device(int, int) { refuse("cuda device"); }
int gpu_of(const Device&) { refuse("cuda device"); }
std::shared_ptr<NcclIds> make_nccl_ids() { refuse("NCCL"); }
std::string new_nccl_id() { refuse("NCCL"); }
std::unique_ptr<Communicator> make_nccl_communicator(const std::string&, int, int, const Device&, const NcclGuardOptions&) {
  refuse("NCCL");
}

}  // namespace nax::detail
