#include "nax/global/cost_model.h"

#include <fmt/format.h>

#include <atomic>
#include <mutex>

#include "nax/core/error.h"
#include "nax/io/json.h"

namespace nax {

CostModel::CostModel() {
  links_["intra"] = {"intra", 5e-6, 150e9};
  links_["inter"] = {"inter", 15e-6, 45e9};
}

CostModel CostModel::parse(std::string_view text, const std::string& source) {
  return from_json(io::parse_json(text, source, io::kCostModelCaps, "CostModel::parse"));
}

CostModel CostModel::from_file(const std::string& path) { return from_json(io::read_json(path, io::kCostModelCaps, "CostModel::parse")); }

CostModel CostModel::from_json(const io::JsonValue& root) {
  if (!root.is_object()) root.fail("is {}, not a JSON object", root.brief());
  CostModel model;
  if (const auto links = root.find("links"))
    links->for_each_member([&](const std::string& name, const io::JsonValue& l) {
      const double latency_us = l.at("latency_us").number(0, 1e9), bandwidth = l.at("bandwidth_GBps").number(1e-9, 1e9);
      model.set_link(name, {name, latency_us * 1e-6, bandwidth * 1e9});
    });
  if (const auto link = root.find("default")) model.default_link_ = link->string();
  if (const auto memory = root.find("memory_GBps")) model.memory_Bps_ = memory->number(1e-9, 1e9) * 1e9;
  if (const auto axes = root.find("mesh_axes"))
    axes->for_each_member([&](const std::string& axis, const io::JsonValue& link) {
      if (!model.links_.count(link.string())) link.fail("is '{}', an unknown link", link.string());
      model.assign(axis, link.string());
    });
  if (!model.links_.count(model.default_link_)) fail("CostModel::parse", "'{}': default link '{}' is not defined", root.file(), model.default_link_);
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
