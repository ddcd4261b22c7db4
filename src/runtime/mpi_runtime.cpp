// Runtime::mpi: one process per device under mpirun; per-shard code runs on the calling thread.
// A run ends with every process telling the others how it ended (the control channel), so that
// all of them return from run together, each with an error if any device failed.
#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "comm/mpi/mpi_clock.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_session.h"
#include "comm/mpi/mpi_world.h"
#include "nax/kernels/kernels.h"
#include "nax/trace/trace.h"
#include "runtime/components.h"
#include "runtime/cuda_devices.h"
#include "runtime/runtime_state.h"

namespace nax {

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

class MpiState final : public Runtime::State {
 public:
  MpiState(const Mesh& mesh, const RuntimeOptions& options);

  const Mesh& mesh() const override { return mesh_; }
  const std::vector<int>& local_devices() const override { return devices_; }
  void run(const std::function<void(Shard&)>& fn) override;
  const detail::DeviceShard& shard(int device, std::string_view op) const override;

 private:
  // Runs fn here; on failure tells the other processes at once. How this device ended.
  mpi::RunEnd run_here(const std::function<void(Shard&)>& fn, std::exception_ptr& error);
  // Tells the others how this device ended and waits until every one has told the same.
  void end_run(mpi::RunEnd end, const std::string& reason);
  std::map<std::string, std::size_t> calls_per_group() const;

  Mesh mesh_;
  std::vector<int> devices_;
  std::shared_ptr<mpi::MpiWorld> world_;
  std::unique_ptr<detail::DeviceShard> shard_;
  std::string unusable_;  // why runs are refused (an earlier run left MPI operations pending)
};

// This process's rank among the processes of its node: which of the node's GPUs it drives.
int node_local_rank() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

// NCCL over the group of `axes`: its rank 0 makes the id and MPI broadcasts it to the others.
std::unique_ptr<Communicator> make_mpi_nccl_comm(mpi::MpiWorld& world, const Device& device, const std::vector<std::string>& axes) {
  const std::vector<int> members = world.mesh().group(world.device(), axes);
  const int rank = world.mesh().rank_in_group(world.device(), axes);
  const std::string key = fmt::format("nccl:{}", fmt::join(axes, ","));
  mpi::CommHandle group(world.create_group_comm(members, key, fmt::format("NCCL bootstrap of ({})", key)));
  std::string id = rank == 0 ? detail::new_nccl_id() : std::string();
  int bytes = static_cast<int>(id.size());
  MPI_Bcast(&bytes, 1, MPI_INT, 0, group.get());
  id.resize(static_cast<std::size_t>(bytes));
  MPI_Bcast(id.data(), bytes, MPI_CHAR, 0, group.get());
  const detail::NcclGuardOptions guard{fmt::format("nccl group ({}) of devices [{}]", fmt::join(axes, ","), fmt::join(members, ",")), members,
                                       world.timeout_s(), world.check_collectives()};
  return detail::make_nccl_communicator(id, static_cast<int>(members.size()), rank, device, guard);
}

// Deterministic mode's order depends on its options, read by each process from its own code and
// environment: processes that disagree would compute different bits without a word, so every
// process compares them (the same minimum and maximum everywhere: the same error everywhere), in
// one all-reduce: the maximum of the values and of their negations.
void check_processes_agree_on_determinism(const RuntimeOptions& options) {
  const std::int64_t mode = options.deterministic ? 1 : 0, cut = options.deterministic ? options.deterministic_max_cut : 0;
  const std::int64_t mine[4] = {mode, cut, -mode, -cut};
  std::int64_t most[4] = {};
  MPI_Allreduce(mine, most, 4, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  const std::int64_t high[2] = {most[0], most[1]}, low[2] = {-most[2], -most[3]};
  if (low[0] != high[0])
    fail("Runtime::mpi",
         "RuntimeOptions::deterministic is on in some processes and off in others: every process must run the same mode");
  if (low[1] != high[1])
    fail("Runtime::mpi",
         "deterministic mode's max cut (RuntimeOptions::deterministic_max_cut, NAX_DETERMINISTIC_MAX_CUT) differs between "
         "processes, from {} to {}: it is part of the order of every sum, so every process must use the same",
         low[1], high[1]);
}

MpiState::MpiState(const Mesh& mesh, const RuntimeOptions& options)
    : mesh_(mesh),
      world_(std::make_shared<mpi::MpiWorld>(mesh, options.collective_timeout_s, options.check_collectives,
                                             options.backend == Backend::cpu)) {
  check_processes_agree_on_determinism(options);
  const int d = world_->device();
  devices_ = {d};
  trace::set_process(d, mesh.size());  // one pid and one trace file per rank
  const mpi::ClockOffset clock = mpi::clock_offset_to_process0(MPI_COMM_WORLD);
  trace::set_clock_offset(clock.same_host ? 0 : clock.measured_ns, clock.measured_ns);
  auto world = world_;
  auto device = options.device_factory
                    ? options.device_factory(d)
                    : detail::make_device(d, options.backend, options.backend == Backend::cuda ? node_local_rank() : 0, "Runtime::mpi", mesh_);
  const bool nccl = device->backend() == Backend::cuda;
  if (!nccl && !device->host_accessible())
    fail("Runtime::mpi", "{} keeps its memory off the host, and MPI moves host memory only (use the cuda backend, whose "
         "collectives go through NCCL)", device->str());
  if (options.transport != Transport::automatic && options.transport != (nccl ? Transport::nccl : Transport::host))
    fail("Runtime::mpi", "transport {} is not available under MPI for {} devices (MPI moves host memory, NCCL device memory)",
         transport_name(options.transport), backend_name(device->backend()));
  detail::CommFactory make_comm = [world](const std::vector<std::string>& axes) -> std::unique_ptr<Communicator> {
    return mpi::make_mpi_communicator(world, axes);
  };
  if (nccl)
    make_comm = [world, device](const std::vector<std::string>& axes) { return make_mpi_nccl_comm(*world, *device, axes); };
  device->kernels().bind_thread();  // per-shard code runs on this thread
  shard_ = std::make_unique<detail::DeviceShard>(d, mesh_, std::move(device), std::move(make_comm));
  detail::check_deterministic_mesh(options, mesh_, "Runtime::mpi");
  shard_->set_options(options);
}

const detail::DeviceShard& MpiState::shard(int device, std::string_view op) const {
  if (device < 0 || device >= mesh_.size()) fail(op, "device {} out of range for mesh {}", device, mesh_.str());
  if (device != devices_[0])
    fail(op, "device {} runs in another MPI process (this process runs device {} of mesh {}); ask that process", device, devices_[0],
         mesh_.str());
  return *shard_;
}

std::map<std::string, std::size_t> MpiState::calls_per_group() const {
  std::map<std::string, std::size_t> calls;
  for (const auto& [key, stats] : shard_->comm_stats()) calls[key] = total_calls(stats);
  return calls;
}

mpi::RunEnd MpiState::run_here(const std::function<void(Shard&)>& fn, std::exception_ptr& error) {
  detail::set_current_shard(shard_.get());
  mpi::RunEnd end = mpi::RunEnd::ok;
  bool returned = false;
  try {
    shard_->take_deferred_error();  // a failed run's leftovers
    shard_->rules_use() = {};
    fn(*shard_);
    returned = true;
    if (std::string deferred = shard_->take_deferred_error(); !deferred.empty()) throw Error(deferred);
    shard_->rules_use().check_all_used(shard_->strict_axis_rules());
  } catch (const mpi::Aborted&) {
    error = std::current_exception();
    end = mpi::RunEnd::released;
  } catch (...) {
    error = std::current_exception();
    end = returned ? mpi::RunEnd::failed_late : mpi::RunEnd::failed;
  }
  detail::set_current_shard(nullptr);
  if (end == mpi::RunEnd::failed) world_->control().send_abort(fmt::format("device {} failed: {}", devices_[0], what_of(error)));
  return end;
}

void MpiState::end_run(mpi::RunEnd end, const std::string& reason) {
  mpi::Control& control = world_->control();
  control.send_ended({end, world_->left_pending(), calls_per_group(), reason});
  // No timeout here, as in the local runtime: a device still computing will end its run, or
  // fail in its next collective (released by the abort) and then end it.
  for (int sleep_us = 1;; sleep_us = std::min(2 * sleep_us, 1000)) {
    control.poll();
    if (static_cast<int>(control.ended().size()) == mesh_.size() - 1) break;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
  if (world_->left_pending()) unusable_ = fmt::format("device {} (this process)", devices_[0]);
  for (const auto& [device, ended] : control.ended())
    if (ended.left_pending && unusable_.empty()) unusable_ = fmt::format("device {}", device);
}

void MpiState::run(const std::function<void(Shard&)>& fn) {
  if (!unusable_.empty())
    fail("Runtime::run", "an earlier run on mesh {} failed with MPI operations left pending on {}, which MPI cannot cancel: make a new "
         "Runtime::mpi to run again", mesh_.str(), unusable_);
  world_->control().begin_run(world_->control().epoch() + 1);
  std::exception_ptr error;
  const mpi::RunEnd end = run_here(fn, error);
  end_run(end, end == mpi::RunEnd::failed_late ? fmt::format("device {} failed: {}", devices_[0], what_of(error)) : std::string());
  if (error) std::rethrow_exception(error);
  if (world_->control().aborting()) throw Error(world_->control().abort_reason());
  for (const auto& [device, ended] : world_->control().ended())
    if (ended.end == mpi::RunEnd::failed_late) throw Error(ended.reason);
}

std::unique_ptr<Runtime::State> make_mpi_runtime(const Mesh& mesh, const RuntimeOptions& options) {
  const double timeout = options.collective_timeout_s;  // resolved by Runtime::mpi
  mpi::Session& session = mpi::Session::get();
  if (session.world_size() != mesh.size())
    fail("Runtime::mpi", "mesh {} has {} devices but mpirun started {} processes: start one process per device (mpirun -np {})",
         mesh.str(), mesh.size(), session.world_size(), mesh.size());
  session.set_exit_timeout(timeout);
  detail::configure_blas_threads(options);
  return std::make_unique<MpiState>(mesh, options);
}

bool in_mpi_job() { return mpi::active() || detail::launched_by_mpirun(); }
int mpi_process_index() { return in_mpi_job() ? mpi::Session::get().world_rank() : 0; }
int mpi_process_count() { return in_mpi_job() ? mpi::Session::get().world_size() : 1; }

}  // namespace
}  // namespace nax

// Linking nax::mpi pulls this object in (the target's link options name nax_link_mpi_component,
// static libraries included), and loading it registers Runtime::mpi with the runtime.
extern "C" void nax_link_mpi_component() {}

namespace {
const bool registered = (nax::detail::register_component(nax::detail::MpiComponent{
                             .make_runtime = nax::make_mpi_runtime,
                             .process_index = nax::mpi_process_index,
                             .process_count = nax::mpi_process_count,
                         }),
                         true);
}  // namespace
