// Runtime: the backend-independent part (the backends are local_runtime.cpp and mpi_runtime.cpp).
#include "nax/runtime/runtime.h"

#include <string_view>
#include <utility>

#include "kernels/cpu/kernels.h"
#include "nax/kernels/kernels.h"
#include "nax/kernels/sum_tree.h"
#include "nax/trace/trace.h"
#include "runtime/components.h"
#include "runtime/cuda_devices.h"
#include "runtime/runtime_state.h"

namespace nax {

std::string_view transport_name(Transport transport) {
  switch (transport) {
    case Transport::automatic: return "automatic";
    case Transport::host: return "host";
    case Transport::device: return "device";
    case Transport::nccl: return "nccl";
  }
  return "?";
}

namespace detail {

void check_deterministic_mesh(const RuntimeOptions& options, const Mesh& mesh, std::string_view op) {
  if (!options.deterministic) return;
  if (!is_power_of_two(options.deterministic_max_cut))
    fail(op, "RuntimeOptions::deterministic_max_cut = {}: deterministic mode needs a power of two",
         options.deterministic_max_cut);
  for (const auto& axis : mesh.axis_names()) {
    if (!is_power_of_two(mesh.axis_size(axis)))
      fail(op, "deterministic mode needs a power of two devices along every mesh axis; mesh {} has {} along '{}'", mesh.str(),
           mesh.axis_size(axis), axis);
  }
}

std::shared_ptr<Device> make_device(int d, Backend backend, int slot, std::string_view op, const Mesh& mesh) {
  if (backend == Backend::cpu) return std::make_shared<Device>(d, Backend::cpu, make_caching_host_allocator(), kernels::cpu_kernels_ptr());
  if (!cuda_built()) fail(op, "backend cuda for mesh {}: {}", mesh.str(), cuda_unavailable_reason());
  if (cuda_gpu_count() == 0) fail(op, "backend cuda for mesh {}: this process sees no CUDA GPU", mesh.str());
  return make_cuda_device(d, slot % cuda_gpu_count());
}

void configure_blas_threads(const RuntimeOptions& options) { cpu::set_blas_threads(options.blas_threads); }

}  // namespace detail

int cuda_gpu_count() { return detail::cuda_gpu_count(); }

Runtime Runtime::from_env(const Mesh& mesh, RuntimeOptions options) {
  const std::string_view choice = detail::runtime_choice();
  if (choice == "mpi") return mpi(mesh, options);
  if (choice == "threads" || choice == "local") return local(mesh, options);
  if (!choice.empty()) fail("Runtime::from_env", "NAX_RUNTIME='{}' is neither threads nor mpi", choice);
  return detail::launched_by_mpirun() ? mpi(mesh, options) : local(mesh, options);
}

Runtime::Runtime(std::unique_ptr<State> state) : state_(std::move(state)) {}
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;
Runtime::~Runtime() = default;

const Mesh& Runtime::mesh() const { return state_->mesh(); }
const std::vector<int>& Runtime::local_devices() const { return state_->local_devices(); }

void Runtime::run(const std::function<void(Shard&)>& fn) {
  if (Shard::current() != nullptr) fail("Runtime::run", "called from inside per-shard code (device {}); runs do not nest", Shard::current()->device());
  state_->run(fn);
}

AllocatorStats Runtime::memory(int device) const { return state_->shard(device, "Runtime::memory").memory(); }
CommStats Runtime::comm_stats(int device) const { return state_->shard(device, "Runtime::comm_stats").comm_totals(); }
std::map<std::string, CommStats> Runtime::comm_stats_by_axes(int device) const {
  return state_->shard(device, "Runtime::comm_stats_by_axes").comm_stats();
}

}  // namespace nax
