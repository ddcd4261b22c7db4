#pragma once
// The SPMD runtime: one worker per mesh device; rt.run(fn) runs fn(Shard&) on every device.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "nax/comm/communicator.h"
#include "nax/core/allocator.h"
#include "nax/core/mesh.h"
#include "nax/kernels/device.h"
#include "nax/shard/shard.h"

namespace nax {

// How the devices of one process exchange data (Runtime::local).
enum class Transport {
  automatic,  // host for CPU devices; nccl for CUDA devices with a GPU each; else device
  host,       // peers' buffers read directly by host code (CPU devices)
  device,     // copies and reductions through the devices' kernels (any backend; virtual GPUs)
  nccl,       // NCCL, one communicator per group of mesh axes (CUDA devices on distinct GPUs)
};
std::string_view transport_name(Transport transport);

struct RuntimeOptions {
  // Where per-shard code computes: cpu (simulated devices) or cuda (Runtime::local: mesh device d
  // on GPU d % gpus, so a mesh larger than the GPUs puts several devices on one GPU; Runtime::mpi:
  // one GPU per process, by its rank among the processes of its node).
  Backend backend = Backend::cpu;
  Transport transport = Transport::automatic;
  // Makes mesh device d in place of `backend`'s devices (Runtime::local): a backend kept outside
  // nax, or a test double.
  std::function<std::shared_ptr<Device>(int device)> device_factory = nullptr;
  // A collective whose peers have not all arrived after this long raises an error naming it.
  // 0: $NAX_COLLECTIVE_TIMEOUT_S, else 300 s.
  double collective_timeout_s = 0;
  // BLAS threads for the whole process (OpenBLAS's, and the bf16 GEMM's per device); 0:
  // $OPENBLAS_NUM_THREADS if set, else 1: a simulated device is one thread, one core's worth of
  // compute, and devices do not oversubscribe the cores.
  int blas_threads = 0;
  // MPI: before each collective the group agrees on its signature (op, dtype, count, ...), one
  // small all-reduce, so that ranks calling different collectives get an error naming both calls
  // instead of a hang or a wrong result. Off saves that round trip (a few microseconds). The
  // local runtime always checks (it costs nothing there).
  bool check_collectives = true;
  // Bitwise-identical results on every mesh (docs/determinism.md): every sum that a mesh could cut
  // (contractions, reductions, psum and its kin, the gradient of a lookup) runs in the canonical
  // tree of nax/kernels/sum_tree.h over the global problem, whichever devices hold which blocks. Every
  // mesh axis must have a power of two devices. Slower; off by default.
  bool deterministic = false;
  // The most devices a sum may be cut over in deterministic mode (a power of two): the trees'
  // first log2 of it halvings are fixed, so bits depend on it and meshes whose bits are compared
  // must share it. Larger allows more devices along a cut at the cost of shorter leaves in short
  // sums. 0: $NAX_DETERMINISTIC_MAX_CUT, else 8 (SumTree::kMaxCut).
  std::int64_t deterministic_max_cut = 0;
  // Every axis rule applied in a run must cut a tensor of that run: a rule naming a tensor axis
  // that no tensor made with axis rules carries is an error naming it. Off, such a rule is refused
  // only when a carried axis is a near name of it (a misspelling) or when no rule of the run cut
  // anything: a model's rules may name the axes of tensors that other runs make.
  bool strict_axis_rules = false;
  // Checking mode: values typed Invariant over mesh axes are compared across their devices where
  // they leave per-shard code (returned by run, gathered, asserted with expect_vary), and remat
  // compares its recompute on devices the host cannot read. Unset: on when $NAX_CHECK is set to
  // anything but 0.
  std::optional<bool> check_values = std::nullopt;
  // The global view prints every sharding decision (device 0). Unset: $NAX_SHARDING_LOG as above.
  std::optional<bool> sharding_log = std::nullopt;
};


class Runtime {
 public:
  // One worker thread per device in this process, communicating through shared memory.
  static Runtime local(const Mesh& mesh, RuntimeOptions options = {});
  // One process per device under mpirun (device = rank in MPI_COMM_WORLD); per-shard code runs on
  // the thread that calls run. MPI is initialised on first use and finalised at exit. Collective
  // over all processes: each must call it, with the same mesh. The world size must equal the
  // mesh's device count, else every process raises the same error. Raises an error when nax was
  // built without MPI (NAX_WITH_MPI=OFF).
  static Runtime mpi(const Mesh& mesh, RuntimeOptions options = {});
  // Runtime::mpi when this process was started by mpirun (OMPI_COMM_WORLD_SIZE, PMIX_RANK or
  // PMI_SIZE set), else Runtime::local. $NAX_RUNTIME=threads or mpi overrides the choice.
  static Runtime from_env(const Mesh& mesh, RuntimeOptions options = {});

  Runtime(Runtime&&) noexcept;
  Runtime& operator=(Runtime&&) noexcept;
  ~Runtime();

  const Mesh& mesh() const;
  int size() const { return mesh().size(); }

  // The devices whose per-shard code runs in this process: all of them under threads, this
  // process's one under MPI.
  const std::vector<int>& local_devices() const;

  // Runs fn on every device and waits. If any device throws, the others are released from the
  // collectives they wait in, and the first error is rethrown here. Under MPI, every process
  // runs fn on its device and returns when all have ended the run; each rethrows its own error,
  // or, if it succeeded, the first failure it heard of. A run that left MPI operations pending
  // (a timeout, a device released mid-collective) makes later runs of this runtime fail (MPI
  // cannot cancel them); a new runtime works.
  void run(const std::function<void(Shard&)>& fn);

  // The same, collecting each device's return value (indexed by device). Returned tensors are
  // checked under NAX_CHECK=1 (Shard::check_returned). Under MPI only this
  // process's slot (local_devices()) is filled; the others hold default values.
  template <typename F, typename R = std::invoke_result_t<F, Shard&>>
    requires(!std::is_void_v<R>)
  std::vector<R> run(F&& fn) {
    std::vector<R> results(static_cast<std::size_t>(size()));
    run(std::function<void(Shard&)>([&](Shard& s) {
      R& result = results[static_cast<std::size_t>(s.device())] = fn(s);
      if constexpr (std::is_same_v<R, Tensor>) s.check_returned(result);
      if constexpr (std::is_same_v<R, std::vector<Tensor>>)
        for (const Tensor& t : result) s.check_returned(t);
    }));
    return results;
  }

  // These three answer for the devices of this process (local_devices()); under MPI, asking for
  // another process's device is an error.
  AllocatorStats memory(int device) const;
  // Calls and bytes per collective kind summed over `device`'s communicators, and per group of
  // mesh axes.
  CommStats comm_stats(int device) const;
  std::map<std::string, CommStats> comm_stats_by_axes(int device) const;

  struct State;

 private:
  explicit Runtime(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// This process among the program's processes (jax.process_index / process_count): its rank in
// MPI_COMM_WORLD and the world's size when started by mpirun or once MPI is initialised
// (initialising it if needed), else 0 and 1. Process 0 is the one that prints and writes files.
int process_index();
int process_count();

// The CUDA GPUs this process sees: 0 when there are none or nax was built without CUDA.
int cuda_gpu_count();

}  // namespace nax
