// The process-wide recorder behind nax/trace/trace.h: each thread appends to a buffer of its own (no lock
// per span); write() takes them all.
#include "nax/trace/trace.h"

#include <fmt/format.h>

#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "nax/core/error.h"

namespace nax::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
thread_local Observer* t_observer = nullptr;
}

Observer* set_thread_observer(Observer* observer) { return std::exchange(detail::t_observer, observer); }

namespace {

struct Event {
  std::string_view category;
  std::string name, args;
  std::int64_t start_ns, duration_ns;
  int device;  // its track: a device, -1 the host, -2 - d device d's transfers
  std::int64_t thread_start_ns = -1, thread_duration_ns = -1;
};

struct ThreadBuffer {
  std::mutex mutex;  // taken by its own thread per span (uncontended) and by write()
  std::vector<Event> events;
  std::uint64_t generation = 0;  // the start() these events belong to
};

struct Recorder {
  std::mutex mutex;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // kept after their threads end
  std::atomic<std::uint64_t> generation{0};
  int process_index = 0, process_count = 1;
  std::int64_t applied_offset_ns = 0, measured_offset_ns = 0;
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // never destroyed: threads may record during exit
  return *r;
}

thread_local int t_device = -1;
thread_local std::shared_ptr<ThreadBuffer> t_buffer;

ThreadBuffer& thread_buffer() {
  if (!t_buffer) {
    t_buffer = std::make_shared<ThreadBuffer>();
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    r.buffers.push_back(t_buffer);
  }
  return *t_buffer;
}

// CLOCK_MONOTONIC: one clock for every process of a node, so that per-rank files line up.
std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The calling thread's CPU time; read for the slices that are not ops (RecordedSlice).
std::int64_t thread_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
bool with_thread_time(std::string_view category) { return category != "op"; }

std::string microseconds(std::int64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

// Host threads get tids after the devices' (tid = device), transfers after the host's.
constexpr int kHostTid = 1000;
constexpr int kTransfersTid = 2000;  // + the device

}  // namespace

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<int>(c));
        else out += c;
    }
  }
  return out + "\"";
}

void start() {
  Recorder& r = recorder();
  {
    std::lock_guard lock(r.mutex);
    ++r.generation;
    for (auto& b : r.buffers) {
      std::lock_guard buffer_lock(b->mutex);
      b->events.clear();
      b->generation = r.generation.load();
    }
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void stop() { detail::g_enabled.store(false, std::memory_order_relaxed); }

void resume() { detail::g_enabled.store(true, std::memory_order_relaxed); }

std::size_t event_count() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  std::size_t n = 0;
  for (auto& b : r.buffers) {
    std::lock_guard buffer_lock(b->mutex);
    if (b->generation == r.generation) n += b->events.size();
  }
  return n;
}

std::vector<RecordedSlice> recorded() {
  std::vector<RecordedSlice> out;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  for (auto& b : r.buffers) {
    std::lock_guard buffer_lock(b->mutex);
    if (b->generation != r.generation) continue;
    for (const Event& e : b->events)
      out.push_back({std::string(e.category), e.name, e.args, e.start_ns, e.duration_ns, e.device <= -2 ? -2 - e.device : e.device,
                     e.device <= -2, e.thread_start_ns, e.thread_duration_ns});
  }
  return out;
}

void set_thread_device(int device) { t_device = device; }
void set_thread_transfers(int device) { t_device = -2 - device; }
int thread_device() { return t_device >= 0 ? t_device : t_device <= -2 ? -2 - t_device : -1; }

void set_process(int index, int count) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.process_index = index;
  r.process_count = count;
}

std::int64_t clock_ns() { return now_ns(); }

void set_clock_offset(std::int64_t applied_ns, std::int64_t measured_ns) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.applied_offset_ns = applied_ns;
  r.measured_offset_ns = measured_ns;
}

std::string process_path(const std::string& path) {
  Recorder& r = recorder();
  int index = 0, count = 1;
  {
    std::lock_guard lock(r.mutex);
    index = r.process_index, count = r.process_count;
  }
  if (count <= 1) return path;
  const std::size_t slash = path.find_last_of('/'), dot = path.find_last_of('.');
  const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  return has_extension ? fmt::format("{}.rank{}{}", path.substr(0, dot), index, path.substr(dot))
                       : fmt::format("{}.rank{}", path, index);
}

void Span::begin(std::string_view category, std::string_view name) {
  category_ = category;
  name_ = name;
  if (with_thread_time(category)) thread_start_ns_ = thread_ns();
  start_ns_ = now_ns();
  active_ = true;
}

void Span::add_args(std::string_view members) {
  if (!active_ || members.empty()) return;
  if (!args_.empty()) args_ += ", ";
  args_ += members;
}

void Span::record() {
  const std::int64_t end_ns = now_ns();
  const std::int64_t thread_duration_ns = thread_start_ns_ >= 0 ? thread_ns() - thread_start_ns_ : -1;
  active_ = false;
  ThreadBuffer& b = thread_buffer();
  std::lock_guard lock(b.mutex);
  if (const std::uint64_t g = recorder().generation.load(); b.generation != g) {  // a buffer made (or last used) before this start()
    b.events.clear();
    b.generation = g;
  }
  b.events.push_back(Event{category_, std::move(name_), std::move(args_), start_ns_, end_ns - start_ns_, t_device, thread_start_ns_,
                           thread_duration_ns});
}

void write(const std::string& requested_path, std::string_view process) {
  const std::string path = process_path(requested_path);
  Recorder& r = recorder();
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  std::set<int> devices, transfers;
  bool host = false;
  int pid = 0;
  std::int64_t applied = 0, measured = 0;
  {
    std::lock_guard lock(r.mutex);
    pid = r.process_index;
    applied = r.applied_offset_ns, measured = r.measured_offset_ns;
    for (auto& b : r.buffers) {
      std::lock_guard buffer_lock(b->mutex);
      if (b->generation != r.generation) continue;
      for (const Event& e : b->events) {
        const int tid = e.device >= 0 ? e.device : e.device == -1 ? kHostTid : kTransfersTid + (-2 - e.device);
        if (e.device >= 0) devices.insert(e.device);
        else if (e.device == -1) host = true;
        else transfers.insert(-2 - e.device);
        const std::string thread_time = e.thread_start_ns < 0 ? std::string()
                                        : fmt::format(", \"tts\": {}, \"tdur\": {}", microseconds(e.thread_start_ns),
                                                      microseconds(e.thread_duration_ns));
        out += fmt::format("{{\"ph\": \"X\", \"cat\": \"{}\", \"name\": {}, \"pid\": {}, \"tid\": {}, \"ts\": {}, \"dur\": {}{}, \"args\": {{{}}}}},\n",
                           e.category, quote(e.name), pid, tid, microseconds(e.start_ns - applied), microseconds(e.duration_ns), thread_time,
                           e.args);
      }
    }
  }
  // The clock offsets (to process 0's clock, in µs) ride on the process's metadata.
  out += fmt::format("{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {}, \"tid\": 0, \"args\": {{\"name\": {}, "
                     "\"clock_offset_us\": {:.3f}, \"measured_clock_offset_us\": {:.3f}}}}}",
                     pid, quote(fmt::format("{} (process {})", process, pid)), applied / 1e3, measured / 1e3);
  for (int d : devices) {
    out += fmt::format(",\n{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {}, \"tid\": {}, \"args\": {{\"name\": \"device {}\"}}}}", pid, d, d);
    out += fmt::format(",\n{{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": {}, \"tid\": {}, \"args\": {{\"sort_index\": {}}}}}", pid, d, 2 * d);
  }
  for (int d : transfers) {
    const int tid = kTransfersTid + d;
    out += fmt::format(",\n{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {}, \"tid\": {}, \"args\": {{\"name\": \"device {} transfers\"}}}}", pid, tid, d);
    out += fmt::format(",\n{{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": {}, \"tid\": {}, \"args\": {{\"sort_index\": {}}}}}", pid, tid, 2 * d + 1);
  }
  if (host) out += fmt::format(",\n{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {}, \"tid\": {}, \"args\": {{\"name\": \"host\"}}}}", pid, kHostTid);
  out += "\n]}\n";
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) fail("trace", "cannot write the trace to '{}'", path);
  file << out;
  file.close();
  if (!file) fail("trace", "failed writing the trace to '{}'", path);
}

Scope::Scope(std::string path, std::string process) : path_(std::move(path)), process_(std::move(process)) {
  if (!path_.empty()) start();
}

Scope::~Scope() {
  if (path_.empty()) return;
  stop();
  try {
    write(path_, process_);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());  // a destructor cannot throw
  }
}

}  // namespace nax::trace
