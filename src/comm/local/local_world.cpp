#include "comm/local/local_world.h"

#include <fmt/format.h>

#include <thread>

#include "nax/trace/trace.h"

namespace nax::local {

using Clock = std::chrono::steady_clock;

LocalGroup::LocalGroup(LocalWorld& world, std::vector<int> members, std::string axes_label)
    : world_(world), members_(std::move(members)), slots_(members_.size()),
      spin_(world.mesh().size() <= static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  label_ = fmt::format("group {} of devices [{}]", axes_label, fmt::join(members_, ","));
}

std::string LocalGroup::mismatch_message() const {
  const Slot& first = slots_[0];
  for (std::size_t r = 1; r < slots_.size(); ++r)
    if (!(slots_[r].sig == first.sig))
      return nax::mismatch_message(label_, members_[0], first.sig, members_[r], slots_[r].sig);
  return {};
}

void LocalGroup::fail_waiting(std::unique_lock<std::mutex>& lock, int rank, const std::string& why) {
  const std::string mine = slots_[static_cast<std::size_t>(rank)].sig.str();
  const std::string hint = backward_hint(slots_[static_cast<std::size_t>(rank)].sig);
  std::vector<int> missing_devices;
  for (std::size_t r = 0; r < slots_.size(); ++r)
    if (!slots_[r].arrived) missing_devices.push_back(members_[r]);
  lock.unlock();  // the statuses take other groups' locks, and abort() wakes every group
  std::vector<std::string> missing;
  for (int d : missing_devices) missing.push_back(fmt::format("device {} ({})", d, world_.status(d)));
  std::string message = fmt::format("{} on device {} in {} {}; not arrived: {}{}", mine, members_[static_cast<std::size_t>(rank)], label_,
                                    why, fmt::join(missing, ", "), hint);
  world_.abort(message);
  throw Error(message);
}

std::string LocalGroup::waiting_status(int device) {
  std::lock_guard lock(mutex_);
  for (std::size_t r = 0; r < members_.size(); ++r)
    if (members_[r] == device && slots_[r].arrived) return fmt::format("waiting in {} in {}", slots_[r].sig.str(), label_);
  return fmt::format("about to wait in {}", label_);
}

std::vector<int> LocalGroup::awaited_by(int device) {
  std::lock_guard lock(mutex_);
  std::vector<int> awaited;
  bool waiting = false;
  for (std::size_t r = 0; r < members_.size(); ++r) {
    if (members_[r] == device) waiting = slots_[r].arrived;
    else if (!slots_[r].arrived) awaited.push_back(members_[r]);
  }
  return waiting ? awaited : std::vector<int>{};
}

bool LocalGroup::spin_until_changed(const std::atomic<std::uint64_t>& counter, std::uint64_t value) const {
  if (!spin_) return false;
  for (int i = 0; i < 20000; ++i) {
    if (counter.load(std::memory_order_acquire) != value) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  return false;
}

void LocalGroup::arrive(int rank, const Signature& sig, const void* send, void* recv, bool tracked) {
  if (world_.aborted()) throw Aborted(fmt::format("{}: not started, the run is aborting: {}", sig.str(), world_.abort_reason()));
  const int me = members_[static_cast<std::size_t>(rank)];
  const trace::Span wait("wait", "wait for peers", [&] { return fmt::format("\"group\": {}", trace::quote(label_)); });
  if (tracked) world_.set_waiting(me, this);
  std::unique_lock lock(mutex_);
  Slot& slot = slots_[static_cast<std::size_t>(rank)];
  slot.send = send, slot.recv = recv, slot.sig = sig, slot.arrived = true;
  const std::uint64_t generation = generation_.load();
  if (++arrived_ == size()) {
    error_ = mismatch_message();
    arrived_ = 0;
    for (auto& s : slots_) s.arrived = false;
    generation_.store(generation + 1, std::memory_order_release);
    cv_.notify_all();
  } else {
    lock.unlock();
    spin_until_changed(generation_, generation);
    lock.lock();
    const auto start = Clock::now();
    const auto timeout = std::chrono::duration<double>(world_.timeout_s());
    while (generation_ == generation) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (generation_ != generation) break;
      if (world_.aborted())
        throw Aborted(fmt::format("{} on device {}: released because the run is aborting: {}", sig.str(), me, world_.abort_reason()));
      for (std::size_t r = 0; r < slots_.size(); ++r)
        if (!slots_[r].arrived && world_.finished(members_[r]))
          fail_waiting(lock, rank, fmt::format("cannot complete: device {} finished its program without calling it", members_[r]));
      if (Clock::now() - start > timeout)
        fail_waiting(lock, rank, fmt::format("timed out after {:g} s (NAX_COLLECTIVE_TIMEOUT_S)", world_.timeout_s()));
      lock.unlock();  // the search reads other groups under their locks
      const std::vector<int> cycle = tracked ? world_.wait_cycle(me) : std::vector<int>{};
      lock.lock();
      if (generation_ != generation) break;
      if (!cycle.empty()) {
        std::vector<std::string> waits;
        for (std::size_t i = 0; i < cycle.size(); ++i)
          waits.push_back(fmt::format("device {} waits for device {}", cycle[i], cycle[(i + 1) % cycle.size()]));
        fail_waiting(lock, rank, fmt::format("cannot complete: a deadlock ({}): the devices call collectives over different "
                                             "groups in different orders", fmt::join(waits, ", ")));
      }
    }
  }
  std::string error = error_;
  lock.unlock();
  if (tracked) world_.set_running(me);
  if (!error.empty()) throw Error(error);
}

void LocalGroup::step(int) {
  const trace::Span wait("wait", "wait for peers (step)", [&] { return fmt::format("\"group\": {}", trace::quote(label_)); });
  const std::uint64_t generation = step_generation_.load(std::memory_order_acquire);
  if (stepped_.fetch_add(1, std::memory_order_acq_rel) + 1 == size()) {
    stepped_.store(0, std::memory_order_relaxed);  // visible to whoever sees the new generation
    std::lock_guard lock(mutex_);
    step_generation_.store(generation + 1, std::memory_order_release);
    cv_.notify_all();
    return;
  }
  if (spin_until_changed(step_generation_, generation)) return;
  std::unique_lock lock(mutex_);
  // A peer that failed inside the collective (the device transport's copies can) never steps:
  // its failure aborts the world, which releases the others here.
  while (!cv_.wait_for(lock, std::chrono::milliseconds(20),
                       [&] { return step_generation_.load(std::memory_order_acquire) != generation; }))
    if (world_.aborted()) throw Aborted(fmt::format("{}: released mid-collective because the run is aborting: {}", label_, world_.abort_reason()));
}

void LocalGroup::wake() {
  std::lock_guard lock(mutex_);
  cv_.notify_all();
}

void LocalGroup::reset() {
  std::lock_guard lock(mutex_);
  arrived_ = 0;
  stepped_ = 0;
  for (auto& s : slots_) s = Slot{};
  error_.clear();
}

LocalWorld::LocalWorld(Mesh mesh, double timeout_s)
    : mesh_(std::move(mesh)), timeout_s_(timeout_s), waiting_in_(static_cast<std::size_t>(mesh_.size())),
      finished_(static_cast<std::size_t>(mesh_.size())) {}

std::shared_ptr<LocalGroup> LocalWorld::group(int device, const std::vector<std::string>& axes) {
  std::vector<int> members = mesh_.group(device, axes);
  std::lock_guard lock(mutex_);
  auto& g = groups_[{axes, members[0]}];
  if (!g) g = std::make_shared<LocalGroup>(*this, std::move(members), fmt::format("({})", fmt::join(axes, ",")));
  return g;
}

void LocalWorld::set_finished(int device) {
  finished_[static_cast<std::size_t>(device)].store(true);
  std::vector<std::shared_ptr<LocalGroup>> groups;
  {
    std::lock_guard lock(mutex_);
    for (auto& [key, g] : groups_) groups.push_back(g);
  }
  for (auto& g : groups) g->wake();
}

std::string LocalWorld::status(int device) const {
  if (finished(device)) return "finished its program";
  LocalGroup* group = waiting_in_[static_cast<std::size_t>(device)].load();
  return group != nullptr ? group->waiting_status(device) : "running";
}

std::vector<int> LocalWorld::wait_cycle(int device) const {
  // Depth-first over "waits for" edges from `device`, back to it.
  std::vector<int> path{device};
  std::vector<bool> seen(static_cast<std::size_t>(mesh_.size()));
  std::vector<std::vector<int>> pending;
  auto edges = [&](int d) {
    LocalGroup* g = waiting_in_[static_cast<std::size_t>(d)].load();
    return g != nullptr ? g->awaited_by(d) : std::vector<int>{};
  };
  pending.push_back(edges(device));
  seen[static_cast<std::size_t>(device)] = true;
  while (!pending.empty()) {
    if (pending.back().empty()) {
      pending.pop_back();
      path.pop_back();
      continue;
    }
    const int next = pending.back().back();
    pending.back().pop_back();
    if (next == device) return path;
    if (seen[static_cast<std::size_t>(next)]) continue;
    seen[static_cast<std::size_t>(next)] = true;
    path.push_back(next);
    pending.push_back(edges(next));
  }
  return {};
}

void LocalWorld::abort(const std::string& reason) {
  std::vector<std::shared_ptr<LocalGroup>> groups;
  {
    std::lock_guard lock(mutex_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
    aborted_.store(true);
    for (auto& [key, g] : groups_) groups.push_back(g);
  }
  for (auto& g : groups) g->wake();
}

std::string LocalWorld::abort_reason() const {
  std::lock_guard lock(mutex_);
  return abort_reason_;
}

void LocalWorld::reset() {
  std::vector<std::shared_ptr<LocalGroup>> groups;
  {
    std::lock_guard lock(mutex_);
    for (auto& [key, g] : groups_) groups.push_back(g);
    for (auto& w : waiting_in_) w.store(nullptr);
    for (auto& f : finished_) f.store(false);
    aborted_.store(false);
    abort_reason_.clear();
  }
  for (auto& g : groups) g->reset();
}

}  // namespace nax::local
