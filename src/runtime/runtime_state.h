#pragma once
// What a Runtime is underneath: one implementation per backend (threads in local_runtime.cpp,
// processes in mpi_runtime.cpp), and the helpers they share.
#include <functional>
#include <string_view>
#include <vector>

#include "nax/runtime.h"
#include "runtime/device_shard.h"

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

// Makes `shard` the one Shard::current() returns on the calling thread (nullptr: none).
void set_current_shard(Shard* shard);

// True when a launcher started this process (mpirun / mpiexec of Open MPI, MPICH or any PMIx one).
bool launched_by_mpirun();

// options.collective_timeout_s, else $NAX_COLLECTIVE_TIMEOUT_S, else 300 s.
double collective_timeout_s(const RuntimeOptions& options);

// Mesh device d on `backend`: a host-memory device on the CPU; on CUDA, GPU `slot` modulo the GPUs
// this process sees. Fails, naming `op` and the mesh, where the backend cannot run.
std::shared_ptr<Device> make_device(int d, Backend backend, int slot, std::string_view op, const Mesh& mesh);

// Refuses, naming `op`, a deterministic runtime on a mesh with an axis whose size is not a power of
// two (the canonical sum trees halve every cut).
void check_deterministic_mesh(const RuntimeOptions& options, const Mesh& mesh, std::string_view op);

// One BLAS thread per device unless the options or $OPENBLAS_NUM_THREADS say otherwise.
void configure_blas_threads(const RuntimeOptions& options);

}  // namespace detail
}  // namespace nax
