#include "nax/global/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>

#include "nax/core/error.h"

namespace nax {

CostModel::CostModel() {
  links_["intra"] = {"intra", 5e-6, 150e9};
  links_["inter"] = {"inter", 15e-6, 45e9};
}

CostModel CostModel::parse(std::string_view text) {
  auto json = nlohmann::json::parse(text, nullptr, false);
  const std::string_view start = text.substr(0, std::min(text.find('\n'), std::size_t{60}));  // its first line, for errors
  if (json.is_discarded() || !json.is_object()) fail("CostModel::parse", "not a JSON object (it starts '{}')", start);
  CostModel model;
  try {
    const auto links = json.value("links", nlohmann::json::object()), axes = json.value("mesh_axes", nlohmann::json::object());
    for (const auto& [name, l] : links.items()) {
      const double latency_us = l.at("latency_us").get<double>(), bandwidth = l.at("bandwidth_GBps").get<double>();
      if (latency_us < 0 || bandwidth <= 0)
        fail("CostModel::parse", "link '{}': latency_us must be >= 0 and bandwidth_GBps > 0 (got {} and {})", name, latency_us, bandwidth);
      model.set_link(name, {name, latency_us * 1e-6, bandwidth * 1e9});
    }
    if (json.contains("default")) model.default_link_ = json["default"].get<std::string>();
    if (json.contains("memory_GBps")) model.memory_Bps_ = json["memory_GBps"].get<double>() * 1e9;
    for (const auto& [axis, link] : axes.items()) model.assign(axis, link.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    fail("CostModel::parse", "malformed cost model (it starts '{}'): {}", start, e.what());
  }
  if (!model.links_.count(model.default_link_)) fail("CostModel::parse", "default link '{}' is not defined", model.default_link_);
  return model;
}

void CostModel::set_link(const std::string& name, Link link) {
  link.name = name;
  links_[name] = std::move(link);
}

void CostModel::assign(const std::string& mesh_axis, const std::string& link_name) {
  if (!links_.count(link_name)) fail("CostModel", "mesh axis '{}' is assigned the unknown link '{}'", mesh_axis, link_name);
  mesh_axes_[mesh_axis] = link_name;
}

const Link& CostModel::link_of(const std::string& mesh_axis) const {
  auto it = mesh_axes_.find(mesh_axis);
  return links_.at(it == mesh_axes_.end() ? default_link_ : it->second);
}

double CostModel::seconds(CollectiveKind kind, std::size_t bytes, int n, const std::string& mesh_axis) const {
  return seconds(kind, bytes, n, link_of(mesh_axis));
}

// Ring algorithms: an all-reduce is a reduce-scatter then an all-gather, 2(n-1) steps each moving
// 1/n of the buffer; an all-gather moves every other device's block once.
double CostModel::seconds(CollectiveKind kind, std::size_t bytes, int n, const Link& link) {
  if (n <= 1) return 0;
  const double b = static_cast<double>(bytes), steps = n - 1, frac = steps / n;
  switch (kind) {
    case CollectiveKind::all_reduce: return 2 * steps * link.latency_s + 2 * frac * b / link.bandwidth_Bps;
    case CollectiveKind::all_gather: return steps * link.latency_s + steps * b / link.bandwidth_Bps;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all: return steps * link.latency_s + frac * b / link.bandwidth_Bps;
    case CollectiveKind::permute: return link.latency_s + b / link.bandwidth_Bps;
    case CollectiveKind::broadcast: return steps * link.latency_s + b / link.bandwidth_Bps;
    case CollectiveKind::barrier: return 2 * steps * link.latency_s;
  }
  return 0;
}

std::string CostModel::str() const {
  std::vector<std::string> links, axes;
  for (const auto& [name, l] : links_) links.push_back(fmt::format("{} ({:.1f} us, {:.0f} GB/s)", name, l.latency_s * 1e6, l.bandwidth_Bps * 1e-9));
  for (const auto& [axis, link] : mesh_axes_) axes.push_back(fmt::format("{}: {}", axis, link));
  return fmt::format("links {}; mesh axes {{{}}}, others {}", fmt::join(links, ", "), fmt::join(axes, ", "), default_link_);
}

namespace {
std::mutex g_model_mutex;
std::shared_ptr<const CostModel> g_model = std::make_shared<const CostModel>();
std::atomic<std::uint64_t> g_model_version{1};
}  // namespace

std::shared_ptr<const CostModel> cost_model() {
  std::lock_guard lock(g_model_mutex);
  return g_model;
}

void set_cost_model(CostModel model) {
  std::lock_guard lock(g_model_mutex);
  g_model = std::make_shared<const CostModel>(std::move(model));
  g_model_version.fetch_add(1);
}

namespace global_detail {
std::uint64_t cost_model_version() { return g_model_version.load(); }
}  // namespace global_detail

}  // namespace nax
