#pragma once
// What a Runtime is underneath: one implementation per backend (threads in local_runtime.cpp,
// processes in mpi_runtime.cpp), and the helpers they share.
#include <functional>
#include <string_view>
#include <vector>

#include "nax/runtime/runtime.h"
#include "runtime/device_shard.h"
#include "shard/current.h"

namespace nax {

struct Runtime::State {
  virtual ~State() = default;
  virtual const Mesh& mesh() const = 0;
  virtual const std::vector<int>& local_devices() const = 0;
  virtual void run(const std::function<void(Shard&)>& fn) = 0;
  // The shard of `device`, which must run in this process (else an error naming `op`).
  virtual const detail::DeviceShard& shard(int device, std::string_view op) const = 0;
};

namespace detail {

// The options with what they leave unset read from the environment (environment.cpp, the one place
// nax reads it; docs/architecture.md lists the variables): every runtime is made with them.
RuntimeOptions with_environment(RuntimeOptions options);

// True when a launcher started this process (mpirun / mpiexec of Open MPI, MPICH or any PMIx one).
bool launched_by_mpirun();

// $NAX_RUNTIME: threads, mpi or empty (environment.cpp).
std::string_view runtime_choice();

// Mesh device d on `backend`: a host-memory device on the CPU; on CUDA, GPU `slot` modulo the GPUs
// this process sees. Fails, naming `op` and the mesh, where the backend cannot run.
std::shared_ptr<Device> make_device(int d, Backend backend, int slot, std::string_view op, const Mesh& mesh);

// Refuses, naming `op`, a deterministic runtime on a mesh with an axis whose size is not a power of
// two (the canonical sum trees halve every cut).
void check_deterministic_mesh(const RuntimeOptions& options, const Mesh& mesh, std::string_view op);

// The options' BLAS threads (resolved by with_environment) for the process.
void configure_blas_threads(const RuntimeOptions& options);

}  // namespace detail
}  // namespace nax
