// The members every Shard shares, and the shard each thread runs.
#include "nax/shard/shard.h"

#include <utility>

#include "nax/kernels/kernels.h"
#include "nax/trace/trace.h"
#include "shard/current.h"

namespace nax {

namespace {
thread_local Shard* g_current_shard = nullptr;
}  // namespace

Shard* Shard::current() { return g_current_shard; }

void Shard::synchronize() const { device_ptr()->kernels().synchronize(); }

void Shard::defer_error(std::string message) {
  if (deferred_error_.empty()) deferred_error_ = std::move(message);
}

std::string Shard::take_deferred_error() { return std::exchange(deferred_error_, {}); }

std::map<std::string, CommStats> Shard::comm_stats_since(const std::map<std::string, CommStats>& before) const {
  std::map<std::string, CommStats> since;
  for (const auto& [axes, stats] : comm_stats()) {
    auto it = before.find(axes);
    since[axes] = it == before.end() ? stats : stats - it->second;
  }
  return since;
}

namespace detail {

void set_current_shard(Shard* shard) {
  g_current_shard = shard;
  Device::make_current(shard != nullptr ? &shard->device_ptr() : nullptr);  // where the shard's new tensors live
  trace::set_thread_device(shard != nullptr ? shard->device() : -1);  // the thread's spans go to its device's track
}

}  // namespace detail
}  // namespace nax
