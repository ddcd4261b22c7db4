#include "replay.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

namespace gptj {

using namespace nax;

namespace {

using Slice = trace::RecordedSlice;

std::int64_t end_of(const Slice& s) { return s.start_ns + s.duration_ns; }
double seconds(std::int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// The communicator call a named collective makes.
CollectiveKind kind_of(const std::string& name) {
  if (name.starts_with("all_gather")) return CollectiveKind::all_gather;
  if (name == "psum_scatter") return CollectiveKind::reduce_scatter;
  if (name == "ppermute") return CollectiveKind::permute;
  if (name == "all_to_all") return CollectiveKind::all_to_all;
  return CollectiveKind::all_reduce;  // psum, pmean, pmax, pmin
}

// A collective slice's time less the waits for peers inside it: the transfer.
double transfer_seconds(const Slice& c, const std::vector<const Slice*>& waits) {
  std::int64_t waited = 0;
  for (const Slice* w : waits)
    if (w->start_ns >= c.start_ns && end_of(*w) <= end_of(c)) waited += w->duration_ns;
  return seconds(std::max<std::int64_t>(c.duration_ns - waited, 0));
}

std::string axes_of(const nlohmann::json& args) {
  std::vector<std::string> axes;
  for (const auto& a : args.at("mesh_axes")) axes.push_back(a.get<std::string>());
  return fmt::format("{}", fmt::join(axes, ","));
}

// Whether mesh axis `name` is one of `axes` ("dp,mp").
bool among(const std::string& name, const std::string& axes) {
  std::size_t from = 0;
  while (from <= axes.size()) {
    const std::size_t comma = std::min(axes.find(',', from), axes.size());
    if (axes.compare(from, comma - from, name) == 0) return true;
    from = comma + 1;
  }
  return false;
}

Timeline timeline_of(const std::vector<const Slice*>& own, const std::vector<const Slice*>& transfers, std::int64_t begin,
                     std::int64_t end) {
  std::vector<const Slice*> collectives, waits;
  for (const Slice* s : own) {
    if (s->start_ns < begin || end_of(*s) > end) continue;
    if (s->category == "collective") collectives.push_back(s);
    if (s->category == "wait") waits.push_back(s);
  }
  std::sort(collectives.begin(), collectives.end(), [](const Slice* a, const Slice* b) { return a->start_ns < b->start_ns; });
  std::map<std::uint64_t, double> transferred;  // by ticket: the started transfers' own time
  for (const Slice* t : transfers)
    if (t->category == "collective") {
      const auto args = nlohmann::json::parse("{" + t->args + "}");
      std::vector<const Slice*> inner;
      for (const Slice* w : transfers)
        if (w->category == "wait") inner.push_back(w);
      transferred[args.at("ticket").get<std::uint64_t>()] = transfer_seconds(*t, inner);
    }
  Timeline out;
  std::int64_t cursor = begin;
  auto compute = [&](std::int64_t until) {
    if (until > cursor) {
      TimelineEvent e;
      e.seconds = seconds(until - cursor);
      out.push_back(e);
    }
    cursor = std::max(cursor, until);
  };
  for (const Slice* c : collectives) {
    if (c->start_ns < cursor) continue;  // inside the previous collective (a collective made of others)
    const auto args = nlohmann::json::parse("{" + c->args + "}");
    if (c->name == "complete a started collective") {
      compute(c->start_ns);
      TimelineEvent wait;
      wait.kind = TimelineEvent::Kind::wait;
      wait.ticket = args.at("ticket").get<std::uint64_t>();
      out.push_back(wait);
      cursor = end_of(*c);
      continue;
    }
    if (args.at("group_size").get<int>() <= 1) continue;  // nothing moves: compute
    TimelineEvent e;
    e.collective = kind_of(c->name), e.bytes = args.at("bytes").get<std::size_t>(), e.mesh_axes = axes_of(args);
    if (args.contains("ticket")) {  // started: its own slice is the device's time; the transfer ran on the worker
      compute(end_of(*c));
      e.kind = TimelineEvent::Kind::start;
      e.ticket = args.at("ticket").get<std::uint64_t>();
      e.seconds = transferred.count(e.ticket) ? transferred.at(e.ticket) : -1;  // no transfers track (MPI, NCCL): unknown
    } else {
      compute(c->start_ns);
      e.kind = TimelineEvent::Kind::collective;
      e.seconds = transfer_seconds(*c, waits);
      cursor = end_of(*c);
    }
    out.push_back(e);
  }
  compute(end);
  return out;
}

// The devices of `device`'s group over `axes` ("dp,mp") and its key among the mesh's groups.
std::string group_key(const Mesh& mesh, int device, const std::string& axes) {
  std::string key = fmt::format("{}|", axes);
  const auto coords = mesh.coords(device);
  const auto names = mesh.axis_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (!among(names[i], axes)) key += fmt::format("{}={},", names[i], coords[i]);
  return key;
}

int group_size(const Mesh& mesh, const std::string& axes) {
  int n = 1;
  for (const auto& name : mesh.axis_names())
    if (among(name, axes)) n *= mesh.axis_size(name);
  return n;
}

// A group's calls, in the order its devices make them (each device's k-th call is the group's k-th).
struct Group {
  struct Call {
    std::map<int, double> arrived;
    double price = 0;  // seconds, once the whole group is there
    std::optional<double> end;
  };
  std::vector<Call> calls;
  std::map<int, std::size_t> made;  // calls each device has made
};

}  // namespace

std::vector<Timeline> timelines_of(const std::vector<trace::RecordedSlice>& slices,
                                   const std::vector<std::pair<std::int64_t, std::int64_t>>& windows) {
  std::vector<std::vector<const Slice*>> own(windows.size()), transfers(windows.size());
  for (const auto& s : slices) {
    if (s.device < 0 || s.device >= static_cast<int>(windows.size())) continue;
    const auto [begin, end] = windows[static_cast<std::size_t>(s.device)];
    if (s.transfers) {
      if (s.start_ns >= begin && s.start_ns < end + 1'000'000'000) transfers[static_cast<std::size_t>(s.device)].push_back(&s);
    } else {
      own[static_cast<std::size_t>(s.device)].push_back(&s);
    }
  }
  std::vector<Timeline> out;
  for (std::size_t d = 0; d < windows.size(); ++d) out.push_back(timeline_of(own[d], transfers[d], windows[d].first, windows[d].second));
  return out;
}

Replayed replay(const std::vector<Timeline>& timelines, const Mesh& mesh, const ReplayCosts& costs) {
  const int devices = static_cast<int>(timelines.size());
  if (devices != mesh.size()) fail("replay", "{} timelines for the {} devices of mesh {}", devices, mesh.size(), mesh.str());
  std::vector<double> clock(timelines.size(), 0), computed(timelines.size(), 0);
  std::vector<std::size_t> next(timelines.size(), 0);
  std::map<std::string, Group> groups;
  std::map<std::pair<int, std::uint64_t>, std::pair<std::string, std::size_t>> tickets;  // (device, ticket) -> its call

  // A group's calls resolve in order: each begins when all its devices have arrived and the one
  // before has ended.
  auto resolve = [&](const std::string& key, int n) {
    Group& g = groups[key];
    double free = 0;
    for (auto& call : g.calls) {
      if (call.end) {
        free = *call.end;
        continue;
      }
      if (static_cast<int>(call.arrived.size()) < n) return;
      double begin = free;
      for (const auto& [device, t] : call.arrived) begin = std::max(begin, t);
      call.end = free = begin + call.price;
    }
  };
  auto arrive = [&](int device, const TimelineEvent& e) {
    const std::string key = group_key(mesh, device, e.mesh_axes);
    Group& g = groups[key];
    const std::size_t k = g.made[device]++;
    if (g.calls.size() <= k) g.calls.resize(k + 1);
    g.calls[k].arrived[device] = clock[static_cast<std::size_t>(device)];
    g.calls[k].price = costs.price(e.collective, e.bytes, e.mesh_axes);
    resolve(key, group_size(mesh, e.mesh_axes));
    return std::pair{key, k};
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int d = 0; d < devices; ++d) {
      const auto i = static_cast<std::size_t>(d);
      while (next[i] < timelines[i].size()) {
        const TimelineEvent& e = timelines[i][next[i]];
        if (e.kind == TimelineEvent::Kind::compute) {
          clock[i] += e.seconds * costs.compute_scale, computed[i] += e.seconds * costs.compute_scale;
        } else if (e.kind == TimelineEvent::Kind::start) {
          tickets[{d, e.ticket}] = arrive(d, e);
        } else {
          std::pair<std::string, std::size_t> call;
          if (e.kind == TimelineEvent::Kind::collective) {
            auto& pending = tickets[{d, 0}];  // a blocking call arrives once, then waits for its end
            if (pending.first.empty()) pending = arrive(d, e);
            call = pending;
          } else {
            auto it = tickets.find({d, e.ticket});
            if (it == tickets.end()) fail("replay", "device {} waits for started collective {}, which it never started", d, e.ticket);
            call = it->second;
          }
          const auto& end = groups[call.first].calls[call.second].end;
          if (!end) break;  // its group is not all there yet
          clock[i] = std::max(clock[i], *end);
          if (e.kind == TimelineEvent::Kind::collective) tickets.erase({d, 0});
        }
        ++next[i];
        progress = true;
      }
    }
  }
  for (int d = 0; d < devices; ++d)
    if (next[static_cast<std::size_t>(d)] < timelines[static_cast<std::size_t>(d)].size())
      fail("replay", "device {} is stuck at event {} of {}: its group's devices made different collectives", d, next[static_cast<std::size_t>(d)],
           timelines[static_cast<std::size_t>(d)].size());
  return {*std::max_element(clock.begin(), clock.end()), *std::max_element(computed.begin(), computed.end())};
}

ReplayCosts measured_costs(const std::map<std::string, Link>& links, const Mesh& mesh) {
  return {1.0, [links, mesh](CollectiveKind kind, std::size_t bytes, const std::string& axes) {
            const auto link = links.find(axes);
            if (link == links.end()) fail("replay", "no link fitted for mesh axes '{}'", axes);
            return CostModel::seconds(kind, bytes, group_size(mesh, axes), link->second);
          }};
}

std::map<std::string, Link> fit_links(const std::vector<Timeline>& timelines, const Mesh& mesh) {
  // per group of axes: sums for least squares of seconds = latency * L + (1 / bandwidth) * W
  struct Sums {
    double ll = 0, lw = 0, ww = 0, lt = 0, wt = 0, t = 0, w = 0;
    std::size_t count = 0;
  };
  std::map<std::string, Sums> sums;
  for (const auto& timeline : timelines)
    for (const auto& e : timeline) {
      if ((e.kind != TimelineEvent::Kind::collective && e.kind != TimelineEvent::Kind::start) || e.seconds < 0) continue;
      const int n = group_size(mesh, e.mesh_axes);
      const double l = CostModel::seconds(e.collective, e.bytes, n, Link{"", 1.0, 1e300});
      const double w = CostModel::seconds(e.collective, e.bytes, n, Link{"", 0.0, 1.0});
      Sums& s = sums[e.mesh_axes];
      s.ll += l * l, s.lw += l * w, s.ww += w * w, s.lt += l * e.seconds, s.wt += w * e.seconds, s.t += e.seconds, s.w += w, ++s.count;
    }
  std::map<std::string, Link> out;
  for (const auto& [axes, s] : sums) {
    const double det = s.ll * s.ww - s.lw * s.lw;
    const bool apart = det > 1e-9 * s.ll * s.ww;  // else every transfer had one size: no latency to tell apart
    double latency = apart ? (s.lt * s.ww - s.wt * s.lw) / det : 0;
    double inverse = apart ? (s.wt * s.ll - s.lt * s.lw) / det : 0;
    if (latency < 0 || inverse <= 0) latency = 0, inverse = s.w > 0 ? s.t / s.w : 0;  // the mean rate, no latency
    out[axes] = Link{axes, latency, inverse > 0 ? 1 / inverse : 1e300};
  }
  return out;
}

}  // namespace gptj
