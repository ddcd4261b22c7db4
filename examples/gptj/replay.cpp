#include "replay.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

std::vector<std::string> axes_of(const nlohmann::json& args) { return args.at("mesh_axes").get<std::vector<std::string>>(); }

// The thread's CPU time at a slice's start and end (-1: not recorded).
std::int64_t thread_at_start(const Slice& s) { return s.thread_start_ns; }
std::int64_t thread_at_end(const Slice& s) { return s.thread_start_ns < 0 ? -1 : s.thread_start_ns + s.thread_duration_ns; }

Timeline timeline_of(const std::vector<const Slice*>& own, const std::vector<const Slice*>& transfers, const Slice& window) {
  const std::int64_t begin = window.start_ns, end = end_of(window);
  std::vector<const Slice*> collectives, waits;
  for (const Slice* s : own) {
    if (s->start_ns < begin || end_of(*s) > end) continue;
    if (s->category == "collective") collectives.push_back(s);
    if (s->category == "wait") waits.push_back(s);
  }
  std::sort(collectives.begin(), collectives.end(), [](const Slice* a, const Slice* b) { return a->start_ns < b->start_ns; });
  std::vector<const Slice*> transfer_waits;
  for (const Slice* w : transfers)
    if (w->category == "wait") transfer_waits.push_back(w);
  std::map<std::uint64_t, double> transferred;  // by ticket: the started transfers' own time
  for (const Slice* t : transfers)
    if (t->category == "collective")
      transferred[nlohmann::json::parse("{" + t->args + "}").at("ticket").get<std::uint64_t>()] = transfer_seconds(*t, transfer_waits);
  Timeline out;
  std::int64_t cursor = begin, thread_cursor = thread_at_start(window);
  // Compute from the cursor to `until`, where the thread's CPU clock read `thread_until`.
  auto compute = [&](std::int64_t until, std::int64_t thread_until) {
    if (until > cursor) {
      TimelineEvent e;
      e.seconds = seconds(until - cursor);
      if (thread_cursor >= 0 && thread_until >= thread_cursor) e.cpu_seconds = std::min(e.seconds, seconds(thread_until - thread_cursor));
      out.push_back(e);
    }
    if (until >= cursor) thread_cursor = thread_until;
    cursor = std::max(cursor, until);
  };
  for (const Slice* c : collectives) {
    if (c->start_ns < cursor) continue;  // inside the previous collective (a collective made of others)
    const auto args = nlohmann::json::parse("{" + c->args + "}");
    if (c->name == "complete a started collective") {
      compute(c->start_ns, thread_at_start(*c));
      TimelineEvent wait;
      wait.kind = TimelineEvent::Kind::wait;
      wait.ticket = args.at("ticket").get<std::uint64_t>();
      out.push_back(wait);
      cursor = end_of(*c), thread_cursor = thread_at_end(*c);
      continue;
    }
    if (args.at("group_size").get<int>() <= 1) continue;  // nothing moves: compute
    TimelineEvent e;
    e.collective = kind_of(c->name), e.bytes = args.at("bytes").get<std::size_t>(), e.mesh_axes = axes_of(args);
    if (args.contains("ticket")) {  // started: its own slice is the device's time; the transfer ran on the worker
      compute(end_of(*c), thread_at_end(*c));
      e.kind = TimelineEvent::Kind::start;
      e.ticket = args.at("ticket").get<std::uint64_t>();
      e.seconds = transferred.count(e.ticket) ? transferred.at(e.ticket) : -1;  // no transfers track (MPI, NCCL): unknown
    } else {
      compute(c->start_ns, thread_at_start(*c));
      e.kind = TimelineEvent::Kind::collective;
      e.seconds = transfer_seconds(*c, waits);
      cursor = end_of(*c), thread_cursor = thread_at_end(*c);
    }
    out.push_back(e);
  }
  compute(end, thread_at_end(window));
  return out;
}

// A group's calls, in the order its devices make them (each device's k-th call is the group's k-th);
// they run one after the other, each once its whole group has arrived.
struct Group {
  struct Call {
    std::map<int, double> arrived;
    double price = 0;  // seconds
    std::optional<double> end;
  };
  std::size_t size = 0;
  std::vector<Call> calls;
  std::map<int, std::size_t> made;  // calls each device has made
  std::size_t resolved = 0;         // the calls before this one have their end
  double free = 0;                  // when the last resolved call ended

  void resolve() {
    for (; resolved < calls.size() && calls[resolved].arrived.size() == size; ++resolved) {
      Call& call = calls[resolved];
      double begin = free;
      for (const auto& [device, t] : call.arrived) begin = std::max(begin, t);
      call.end = free = begin + call.price;
    }
  }
};

// A call of a group: the group's key (its mesh axes and first device) and the call's place.
using CallRef = std::pair<std::pair<std::vector<std::string>, int>, std::size_t>;

}  // namespace

double work_of(const TimelineEvent& e) { return e.cpu_seconds >= 0 ? e.cpu_seconds : e.seconds; }

std::vector<Timeline> timelines_of(const std::vector<trace::RecordedSlice>& slices, const std::vector<trace::RecordedSlice>& windows) {
  std::vector<std::vector<const Slice*>> own(windows.size()), transfers(windows.size());
  for (const auto& s : slices) {
    if (s.device < 0 || s.device >= static_cast<int>(windows.size())) continue;
    const std::int64_t begin = windows[static_cast<std::size_t>(s.device)].start_ns, end = end_of(windows[static_cast<std::size_t>(s.device)]);
    if (s.transfers) {
      if (s.start_ns >= begin && s.start_ns < end + 1'000'000'000) transfers[static_cast<std::size_t>(s.device)].push_back(&s);
    } else {
      own[static_cast<std::size_t>(s.device)].push_back(&s);
    }
  }
  std::vector<Timeline> out;
  for (std::size_t d = 0; d < windows.size(); ++d) out.push_back(timeline_of(own[d], transfers[d], windows[d]));
  return out;
}

double busiest_compute_s(const std::vector<Timeline>& timelines) {
  double busiest = 0;
  for (const auto& timeline : timelines) {
    double computed = 0;
    for (const auto& e : timeline)
      if (e.kind == TimelineEvent::Kind::compute) computed += work_of(e);
    busiest = std::max(busiest, computed);
  }
  return busiest;
}

double replay(const std::vector<Timeline>& timelines, const Mesh& mesh, const ReplayCosts& costs) {
  const int devices = static_cast<int>(timelines.size());
  if (devices != mesh.size()) fail("replay", "{} timelines for the {} devices of mesh {}", devices, mesh.size(), mesh.str());
  const auto n = timelines.size();
  std::vector<std::size_t> next(n, 0);
  std::vector<double> left(n, -1);  // the work left in the compute event under way (-1: none begun)
  std::map<CallRef::first_type, Group> groups;
  std::map<std::pair<int, std::uint64_t>, CallRef> started;  // (device, ticket) -> its call
  std::vector<std::optional<CallRef>> awaited(n);            // the call a device waits for
  double now = 0;  // the last event's time once every device is done: the step's

  auto arrive = [&](int device, const TimelineEvent& e) {
    const std::vector<int> members = mesh.group(device, e.mesh_axes);
    const CallRef::first_type key{e.mesh_axes, members.front()};
    Group& g = groups[key];
    g.size = members.size();
    const std::size_t k = g.made[device]++;
    if (g.calls.size() <= k) g.calls.resize(k + 1);
    g.calls[k].arrived[device] = now;
    g.calls[k].price = costs.price(e.collective, e.bytes, e.mesh_axes);
    g.resolve();
    return CallRef{key, k};
  };
  auto end_of_call = [&](const CallRef& call) { return groups[call.first].calls[call.second].end; };

  // Each device goes as far as it can at `now`: through starts, arrivals and the calls that have
  // ended, up to a compute event with work left or a call that has not.
  auto advance = [&] {
    for (bool progress = true; progress;) {
      progress = false;
      for (int d = 0; d < devices; ++d) {
        const auto i = static_cast<std::size_t>(d);
        while (next[i] < timelines[i].size()) {
          const TimelineEvent& e = timelines[i][next[i]];
          if (e.kind == TimelineEvent::Kind::compute) {
            if (left[i] < 0) left[i] = work_of(e) * costs.compute_scale;
            if (left[i] > 0) break;
          } else if (e.kind == TimelineEvent::Kind::start) {
            started[{d, e.ticket}] = arrive(d, e);
          } else {
            if (!awaited[i]) {
              if (e.kind == TimelineEvent::Kind::collective) {
                awaited[i] = arrive(d, e);  // arrives once, then waits for the call's end
              } else {
                const auto it = started.find({d, e.ticket});
                if (it == started.end()) fail("replay", "device {} waits for started collective {}, which it never started", d, e.ticket);
                awaited[i] = it->second;
              }
              progress = true;
            }
            const auto end = end_of_call(*awaited[i]);
            if (!end || *end > now) break;  // its group is not all there yet, or the call runs on
            awaited[i].reset();
          }
          ++next[i], left[i] = -1;
          progress = true;
        }
      }
    }
  };

  for (;;) {
    advance();
    std::vector<std::size_t> computing;
    double until = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < n; ++i) {
      if (next[i] == timelines[i].size()) continue;
      if (awaited[i]) {
        if (const auto end = end_of_call(*awaited[i])) until = std::min(until, *end);
      } else {
        computing.push_back(i);
      }
    }
    const double k = static_cast<double>(computing.size());
    const double rate = costs.cores > 0 && k > costs.cores ? costs.cores / k : 1.0;
    for (std::size_t i : computing) until = std::min(until, now + left[i] / rate);
    if (!std::isfinite(until)) break;  // every device is done, or stuck
    for (std::size_t i : computing) {
      const double done = (until - now) * rate;
      left[i] = left[i] - done <= 1e-12 * std::max(1.0, left[i]) ? 0.0 : left[i] - done;
      if (left[i] == 0.0) ++next[i], left[i] = -1;
    }
    now = until;
  }
  for (int d = 0; d < devices; ++d)
    if (next[static_cast<std::size_t>(d)] < timelines[static_cast<std::size_t>(d)].size())
      fail("replay", "device {} is stuck at event {} of {}: its group's devices made different collectives", d, next[static_cast<std::size_t>(d)],
           timelines[static_cast<std::size_t>(d)].size());
  return now;
}

ReplayCosts measured_costs(const Links& links, const Mesh& mesh, int cores) {
  return {1.0,
          [links, mesh](CollectiveKind kind, std::size_t bytes, const std::vector<std::string>& axes) {
            const auto link = links.find(axes);
            if (link == links.end()) fail("replay", "no link fitted for mesh axes {}", fmt::join(axes, ","));
            return CostModel::seconds(kind, bytes, mesh.group_size(axes), link->second);
          },
          cores};
}

Links fit_links(const std::vector<Timeline>& timelines, const Mesh& mesh) {
  // per group of axes: sums for least squares of seconds = latency * L + (1 / bandwidth) * W
  struct Sums {
    double ll = 0, lw = 0, ww = 0, lt = 0, wt = 0, t = 0, w = 0;
  };
  std::map<std::vector<std::string>, Sums> sums;
  for (const auto& timeline : timelines)
    for (const auto& e : timeline) {
      if ((e.kind != TimelineEvent::Kind::collective && e.kind != TimelineEvent::Kind::start) || e.seconds < 0) continue;
      const int n = mesh.group_size(e.mesh_axes);
      const double l = CostModel::seconds(e.collective, e.bytes, n, Link{"", 1.0, 1e300});
      const double w = CostModel::seconds(e.collective, e.bytes, n, Link{"", 0.0, 1.0});
      Sums& s = sums[e.mesh_axes];
      s.ll += l * l, s.lw += l * w, s.ww += w * w, s.lt += l * e.seconds, s.wt += w * e.seconds, s.t += e.seconds, s.w += w;
    }
  Links out;
  for (const auto& [axes, s] : sums) {
    const double det = s.ll * s.ww - s.lw * s.lw;
    const bool apart = det > 1e-9 * s.ll * s.ww;  // else every transfer had one size: no latency to tell apart
    double latency = apart ? (s.lt * s.ww - s.wt * s.lw) / det : 0;
    double inverse = apart ? (s.wt * s.ll - s.lt * s.lw) / det : 0;
    if (latency < 0 || inverse <= 0) latency = 0, inverse = s.w > 0 ? s.t / s.w : 0;  // the mean rate, no latency
    out[axes] = Link{fmt::format("{}", fmt::join(axes, ",")), latency, inverse > 0 ? 1 / inverse : 1e300};
  }
  return out;
}

}  // namespace gptj
