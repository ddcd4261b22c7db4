// Runtime::local: one persistent worker thread per mesh device, sharing memory.
#include "nax/runtime.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "comm/local/local_communicator.h"
#include "kernels/cpu/kernels.h"
#include "runtime/device_shard.h"

namespace nax {

namespace {
thread_local Shard* g_current_shard = nullptr;

double default_timeout_s() {
  const char* env = std::getenv("NAX_COLLECTIVE_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return 300.0;
  char* end = nullptr;
  double value = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(value > 0))
    fail("Runtime", "NAX_COLLECTIVE_TIMEOUT_S='{}' is not a positive number of seconds", env);
  return value;
}
}  // namespace

Shard* Shard::current() { return g_current_shard; }

struct Runtime::State {
  Mesh mesh;
  std::shared_ptr<local::LocalWorld> world;
  std::vector<std::unique_ptr<detail::DeviceShard>> shards;
  std::vector<std::thread> workers;

  std::mutex mutex;
  std::condition_variable start_cv, done_cv;
  const std::function<void(Shard&)>* job = nullptr;
  std::uint64_t epoch = 0;
  int remaining = 0;
  bool stopping = false;
  std::exception_ptr error;  // the first error that was not a release caused by another one
  std::exception_ptr released_error;

  void work(int device);
  void record_failure(int device, std::exception_ptr e, bool released);
};

void Runtime::State::record_failure(int device, std::exception_ptr e, bool released) {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
  }
  {
    std::lock_guard lock(mutex);
    if (released && !released_error) released_error = e;
    if (!released && !error) error = e;
  }
  if (!released) world->abort(fmt::format("device {} failed: {}", device, what));
}

void Runtime::State::work(int device) {
  std::uint64_t seen = 0;
  detail::DeviceShard& shard = *shards[static_cast<std::size_t>(device)];
  while (true) {
    const std::function<void(Shard&)>* fn = nullptr;
    {
      std::unique_lock lock(mutex);
      start_cv.wait(lock, [&] { return stopping || epoch != seen; });
      if (stopping) return;
      seen = epoch;
      fn = job;
    }
    g_current_shard = &shard;
    try {
      (*fn)(shard);
    } catch (const local::Aborted&) {
      record_failure(device, std::current_exception(), true);
    } catch (...) {
      record_failure(device, std::current_exception(), false);
    }
    g_current_shard = nullptr;
    world->set_finished(device);
    std::lock_guard lock(mutex);
    if (--remaining == 0) done_cv.notify_all();
  }
}

Runtime::Runtime(std::unique_ptr<State> state) : state_(std::move(state)) {}
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;

Runtime::~Runtime() {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->start_cv.notify_all();
  for (auto& t : state_->workers) t.join();
}

Runtime Runtime::local(const Mesh& mesh, RuntimeOptions options) {
  auto state = std::make_unique<State>();
  state->mesh = mesh;
  const double timeout = options.collective_timeout_s > 0 ? options.collective_timeout_s : default_timeout_s();
  state->world = std::make_shared<local::LocalWorld>(mesh, timeout);
  if (options.blas_threads > 0) cpu::set_blas_threads(options.blas_threads);
  else if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) cpu::set_blas_threads(1);
  for (int d = 0; d < mesh.size(); ++d) {
    auto dev = std::make_shared<Device>(d, Backend::cpu, make_caching_host_allocator());
    auto world = state->world;
    auto make_comm = [world, d](const std::vector<std::string>& axes) -> std::unique_ptr<Communicator> {
      return std::make_unique<local::LocalCommunicator>(world->group(d, axes), world->mesh().rank_in_group(d, axes));
    };
    state->shards.push_back(std::make_unique<detail::DeviceShard>(d, state->mesh, std::move(dev), make_comm));
  }
  State* raw = state.get();
  for (int d = 0; d < mesh.size(); ++d) state->workers.emplace_back([raw, d] { raw->work(d); });
  return Runtime(std::move(state));
}

const Mesh& Runtime::mesh() const { return state_->mesh; }

void Runtime::run(const std::function<void(Shard&)>& fn) {
  if (Shard::current() != nullptr) fail("Runtime::run", "called from inside per-shard code (device {}); runs do not nest", Shard::current()->device());
  State& s = *state_;
  {
    std::unique_lock lock(s.mutex);
    s.job = &fn;
    s.remaining = s.mesh.size();
    s.error = nullptr;
    s.released_error = nullptr;
    ++s.epoch;
    s.start_cv.notify_all();
    s.done_cv.wait(lock, [&] { return s.remaining == 0; });
    s.job = nullptr;
  }
  s.world->reset();
  if (s.error) std::rethrow_exception(s.error);
  if (s.released_error) std::rethrow_exception(s.released_error);
}

AllocatorStats Runtime::memory(int device) const {
  if (device < 0 || device >= size()) fail("Runtime::memory", "device {} out of range for mesh {}", device, mesh().str());
  return state_->shards[static_cast<std::size_t>(device)]->memory();
}

CommStats Runtime::comm_stats(int device) const {
  if (device < 0 || device >= size()) fail("Runtime::comm_stats", "device {} out of range for mesh {}", device, mesh().str());
  return state_->shards[static_cast<std::size_t>(device)]->comm_totals();
}

std::map<std::string, CommStats> Runtime::comm_stats_by_axes(int device) const {
  if (device < 0 || device >= size()) fail("Runtime::comm_stats_by_axes", "device {} out of range for mesh {}", device, mesh().str());
  return state_->shards[static_cast<std::size_t>(device)]->comm_stats();
}

}  // namespace nax
