// Runtime::local: one persistent worker thread per mesh device, sharing memory.
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/local/device_communicator.h"
#include "nax/kernels/kernels.h"
#include "comm/local/local_communicator.h"
#include "runtime/cuda_devices.h"
#include "runtime/runtime_state.h"

namespace nax {

namespace {

class LocalState final : public Runtime::State {
 public:
  LocalState(const Mesh& mesh, const RuntimeOptions& options);
  ~LocalState() override;

  const Mesh& mesh() const override { return mesh_; }
  const std::vector<int>& local_devices() const override { return devices_; }
  void run(const std::function<void(Shard&)>& fn) override;
  const detail::DeviceShard& shard(int device, std::string_view op) const override {
    if (device < 0 || device >= mesh_.size()) fail(op, "device {} out of range for mesh {}", device, mesh_.str());
    return *shards_[static_cast<std::size_t>(device)];
  }

 private:
  detail::CommFactory comm_factory(int d, const std::shared_ptr<Device>& device, Transport transport);
  void work(int device);
  void record_failure(int device, std::exception_ptr e, bool released);

  Mesh mesh_;
  std::vector<int> devices_;
  std::shared_ptr<local::LocalWorld> world_;
  std::shared_ptr<detail::NcclIds> nccl_ids_;
  bool check_collectives_ = true;
  std::vector<std::unique_ptr<detail::DeviceShard>> shards_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(Shard&)>* job_ = nullptr;
  std::uint64_t epoch_ = 0;
  int remaining_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // the first error that was not a release caused by another one
  std::exception_ptr released_error_;
};

bool host_accessible(const std::vector<std::shared_ptr<Device>>& devices) {
  return std::all_of(devices.begin(), devices.end(), [](const auto& d) { return d->host_accessible(); });
}

// The transport `automatic` stands for on these devices.
Transport resolve(Transport transport, const std::vector<std::shared_ptr<Device>>& devices, const Mesh& mesh) {
  if (transport != Transport::automatic) return transport;
  if (host_accessible(devices)) return Transport::host;
  const bool cuda = devices.front()->backend() == Backend::cuda;
  return cuda && detail::cuda_gpu_count() >= mesh.size() ? Transport::nccl : Transport::device;
}

void check_transport(Transport transport, const std::vector<std::shared_ptr<Device>>& devices, const Mesh& mesh) {
  if (transport == Transport::host && !host_accessible(devices))
    fail("Runtime::local", "transport host reads peers' memory from host code, which {} devices do not allow (use device or nccl)",
         backend_name(devices.front()->backend()));
  if (transport != Transport::nccl) return;
  const Backend backend = devices.front()->backend();
  if (backend != Backend::cuda) fail("Runtime::local", "transport nccl needs the cuda backend, not {}", backend_name(backend));
  if (detail::cuda_gpu_count() < mesh.size())
    fail("Runtime::local", "transport nccl needs a GPU per device: mesh {} has {} devices, this process sees {} GPU(s) (NCCL "
         "refuses two ranks of a group on one GPU; use transport device)",
         mesh.str(), mesh.size(), detail::cuda_gpu_count());
}

LocalState::LocalState(const Mesh& mesh, const RuntimeOptions& options)
    : mesh_(mesh), world_(std::make_shared<local::LocalWorld>(mesh, options.collective_timeout_s)) {
  std::vector<std::shared_ptr<Device>> devices;
  for (int d = 0; d < mesh_.size(); ++d) {
    devices.push_back(options.device_factory ? options.device_factory(d)
                                             : detail::make_device(d, options.backend, d, "Runtime::local", mesh_));
    if (!devices.back()) fail("Runtime::local", "the device factory made no device {}", d);
  }
  const Transport transport = resolve(options.transport, devices, mesh_);
  check_transport(transport, devices, mesh_);
  if (transport == Transport::nccl) nccl_ids_ = detail::make_nccl_ids();
  check_collectives_ = options.check_collectives;
  detail::check_deterministic_mesh(options, mesh_, "Runtime::local");
  for (int d = 0; d < mesh_.size(); ++d) {
    devices_.push_back(d);
    auto make_comm = comm_factory(d, devices[static_cast<std::size_t>(d)], transport);
    shards_.push_back(std::make_unique<detail::DeviceShard>(d, mesh_, devices[static_cast<std::size_t>(d)], std::move(make_comm)));
    shards_.back()->set_options(options);
  }
  for (int d = 0; d < mesh_.size(); ++d) workers_.emplace_back([this, d] { work(d); });
}

detail::CommFactory LocalState::comm_factory(int d, const std::shared_ptr<Device>& device, Transport transport) {
  auto world = world_;
  auto rank_of = [world, d](const std::vector<std::string>& axes) { return world->mesh().rank_in_group(d, axes); };
  switch (transport) {
    case Transport::nccl:
      return [world, d, device, ids = nccl_ids_, rank_of, check = check_collectives_](const std::vector<std::string>& axes)
                 -> std::unique_ptr<Communicator> {
        const auto group = world->group(d, axes);
        const detail::NcclGuardOptions guard{group->label(), world->mesh().group(d, axes), world->timeout_s(), check};
        return detail::make_nccl_communicator(ids->id(group->label()), group->size(), rank_of(axes), *device, guard);
      };
    case Transport::device:
      return [world, d, device, rank_of](const std::vector<std::string>& axes) -> std::unique_ptr<Communicator> {
        return local::make_device_communicator(world->group(d, axes), rank_of(axes), device);
      };
    default:
      return [world, d, rank_of](const std::vector<std::string>& axes) -> std::unique_ptr<Communicator> {
        return local::make_local_communicator(world->group(d, axes), rank_of(axes));
      };
  }
}

LocalState::~LocalState() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void LocalState::record_failure(int device, std::exception_ptr e, bool released) {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
  }
  {
    std::lock_guard lock(mutex_);
    if (released && !released_error_) released_error_ = e;
    if (!released && !error_) error_ = e;
  }
  if (!released) world_->abort(fmt::format("device {} failed: {}", device, what));
}

void LocalState::work(int device) {
  std::uint64_t seen = 0;
  detail::DeviceShard& shard = *shards_[static_cast<std::size_t>(device)];
  bool bound = false;
  while (true) {
    const std::function<void(Shard&)>* fn = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || epoch_ != seen; });
      if (stopping_) return;
      seen = epoch_;
      fn = job_;
    }
    detail::set_current_shard(&shard);
    try {
      if (!bound) shard.device_ptr()->kernels().bind_thread(), bound = true;
      shard.take_deferred_error();  // a failed run's leftovers
      shard.rules_use() = {};
      (*fn)(shard);
      if (std::string deferred = shard.take_deferred_error(); !deferred.empty()) throw Error(deferred);
      shard.rules_use().check_all_used(shard.strict_axis_rules());
    } catch (const local::Aborted&) {
      record_failure(device, std::current_exception(), true);
    } catch (...) {
      record_failure(device, std::current_exception(), false);
    }
    detail::set_current_shard(nullptr);
    world_->set_finished(device);
    std::lock_guard lock(mutex_);
    if (--remaining_ == 0) done_cv_.notify_all();
  }
}

void LocalState::run(const std::function<void(Shard&)>& fn) {
  {
    std::unique_lock lock(mutex_);
    job_ = &fn;
    remaining_ = mesh_.size();
    error_ = nullptr;
    released_error_ = nullptr;
    ++epoch_;
    start_cv_.notify_all();
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
  }
  world_->reset();
  if (error_) std::rethrow_exception(error_);
  if (released_error_) std::rethrow_exception(released_error_);
}

}  // namespace

Runtime Runtime::local(const Mesh& mesh, RuntimeOptions options) {
  options = detail::with_environment(std::move(options));
  detail::configure_blas_threads(options);
  return Runtime(std::make_unique<LocalState>(mesh, options));
}

}  // namespace nax
