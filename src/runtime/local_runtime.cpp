// Runtime::local: one persistent worker thread per mesh device, sharing memory.
#include <fmt/format.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/local/local_communicator.h"
#include "runtime/runtime_state.h"

namespace nax {

namespace {

class LocalState final : public Runtime::State {
 public:
  LocalState(const Mesh& mesh, double timeout_s);
  ~LocalState() override;

  const Mesh& mesh() const override { return mesh_; }
  const std::vector<int>& local_devices() const override { return devices_; }
  void run(const std::function<void(Shard&)>& fn) override;
  const detail::DeviceShard& shard(int device, std::string_view op) const override {
    if (device < 0 || device >= mesh_.size()) fail(op, "device {} out of range for mesh {}", device, mesh_.str());
    return *shards_[static_cast<std::size_t>(device)];
  }

 private:
  void work(int device);
  void record_failure(int device, std::exception_ptr e, bool released);

  Mesh mesh_;
  std::vector<int> devices_;
  std::shared_ptr<local::LocalWorld> world_;
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

LocalState::LocalState(const Mesh& mesh, double timeout_s)
    : mesh_(mesh), world_(std::make_shared<local::LocalWorld>(mesh, timeout_s)) {
  for (int d = 0; d < mesh_.size(); ++d) {
    devices_.push_back(d);
    auto dev = std::make_shared<Device>(d, Backend::cpu, make_caching_host_allocator());
    auto world = world_;
    auto make_comm = [world, d](const std::vector<std::string>& axes) -> std::unique_ptr<Communicator> {
      return std::make_unique<local::LocalCommunicator>(world->group(d, axes), world->mesh().rank_in_group(d, axes));
    };
    shards_.push_back(std::make_unique<detail::DeviceShard>(d, mesh_, std::move(dev), make_comm));
  }
  for (int d = 0; d < mesh_.size(); ++d) workers_.emplace_back([this, d] { work(d); });
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
      (*fn)(shard);
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
  const double timeout = detail::collective_timeout_s(options);
  detail::configure_blas_threads(options);
  return Runtime(std::make_unique<LocalState>(mesh, timeout));
}

}  // namespace nax
