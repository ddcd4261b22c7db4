#pragma once
// A timeline of a run in Chrome's trace-event JSON (opens in Perfetto and chrome://tracing): one
// track per device, each op and collective a slice carrying its shapes, mesh axes, vary types and
// bytes; time spent waiting for peers a "wait" slice inside its collective; phases (forward,
// backward, optimizer) and steps as enclosing slices.
//
// Off, every hook costs one relaxed atomic load (and a thread-local pointer test for an Observer). The recorder is process-wide: under mpirun each
// process writes its own file (pid = rank) on process 0's clock (CLOCK_MONOTONIC, shared by the
// processes of a node; a process on another host shifts its timestamps by set_clock_offset), and
// scripts/trace_breakdown.py --merge joins them.
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nax/tensor/tensor.h"

namespace nax::trace {

class Observer;

namespace detail {
extern std::atomic<bool> g_enabled;
extern thread_local Observer* t_observer;
}

// Whether spans are recorded now.
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Clears what was recorded and starts recording.
void start();
// Stops recording (what was recorded is kept until the next start).
void stop();
// Records again after stop(), keeping what was recorded.
void resume();
// Writes what was recorded as trace-event JSON to `path` (an error naming the path when it cannot).
// `process` names this process's track group; pid is this process's index under mpirun, else 0.
// Under mpirun (a process count above 1) each process writes its own file, process_path(path).
void write(const std::string& path, std::string_view process = "nax");
// Where this process writes a trace asked for at `path`: `path` itself in a single process, else
// with ".rank<index>" before the extension ("run.json" -> "run.rank1.json").
std::string process_path(const std::string& path);
// How many spans were recorded since start().
std::size_t event_count();

// A slice recorded since start(), as write() would write it: its track is a device's (`device`,
// or that device's transfers when `transfers`), or the host's (device -1).
struct RecordedSlice {
  std::string category, name;
  std::string args;  // a JSON object's members, without braces
  std::int64_t start_ns = 0, duration_ns = 0;
  int device = -1;
  bool transfers = false;
  // The recording thread's CPU time (CLOCK_THREAD_CPUTIME_ID) at the start and spent inside, -1
  // on op slices (many and short: reading the clock is a system call), written as "tts" and
  // "tdur": between two slices it is what the device computed, apart from waiting for a core.
  std::int64_t thread_start_ns = -1, thread_duration_ns = -1;
};
// This process's slices since start(), in no particular order (a copy: recording may go on).
std::vector<RecordedSlice> recorded();

// The track the calling thread's spans go to: mesh device `device` (the runtimes set it on the
// thread running that device's per-shard code); -1: the host (any other thread).
void set_thread_device(int device);
// The calling thread moves the data of collectives device `device` started (a communicator's
// worker): its spans go to the track "device N transfers", beside the device's own.
void set_thread_transfers(int device);
// The device whose track the calling thread's spans go to (a transfers thread: its device), or -1.
int thread_device();
// This process among `count` (Runtime::mpi sets its rank and the world's size).
void set_process(int index, int count);
// The trace's clock (CLOCK_MONOTONIC, nanoseconds): one clock for the processes of a node.
std::int64_t clock_ns();
// This process's clock minus process 0's: `applied` is subtracted from every timestamp written
// (Runtime::mpi sets it for processes on another host than process 0's, where the clocks differ),
// `measured` is the estimate, recorded in the trace's process metadata either way.
void set_clock_offset(std::int64_t applied_ns, std::int64_t measured_ns);

// Records from construction to destruction, then writes the trace to `path` (when path is empty
// it does nothing). One per process at a time.
class Scope {
 public:
  explicit Scope(std::string path, std::string process = "nax");
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string path_, process_;
};

// What watches a run as it happens, on the calling thread, whether or not the trace records: the
// spans it opens and closes (each op's and collective's extent) and the tensors the ops make. The
// op recorder (nax/debug/op_recorder.h), and through it the locator, is one.
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void opened(std::string_view category, std::string_view name) = 0;
  virtual void closed() = 0;
  // An op made `result` (it is filled before the op returns).
  virtual void made(const Tensor& result) = 0;
  // The running op's result is filled after the op returns (a started collective): not readable yet.
  virtual void filled_later() = 0;
  // `sum` (an op's result) keeps `terms` for psum (deterministic mode's sums of partial sums).
  virtual void terms_kept(const Tensor& sum, const std::vector<Tensor>& terms) = 0;
};
// Sets the calling thread's observer (nullptr: none) and returns the previous one.
Observer* set_thread_observer(Observer* observer);
// The calling thread's observer, or null.
inline Observer* observer() { return detail::t_observer; }
// Tells the thread's observer, if any, that an op made `result`; returns it.
inline const Tensor& made(const Tensor& result) {
  if (Observer* o = observer()) o->made(result);
  return result;
}

// A slice on the calling thread's track, from construction to destruction. `category` is one of
// "op", "collective", "wait", "phase", "step" (a string literal: it is kept as a view; the
// breakdown script reads them). Arguments
// are a JSON object's members, without braces ("\"bytes\": 16"); build them only when enabled().
class Span {
 public:
  Span(std::string_view category, std::string_view name) {
    if (enabled()) begin(category, name);
    observe(category, name);
  }
  template <typename MakeArgs>
  Span(std::string_view category, std::string_view name, MakeArgs&& make_args) {
    if (enabled()) begin(category, name), args_ = std::forward<MakeArgs>(make_args)();
    observe(category, name);
  }
  ~Span() { close(); }
  Span(Span&& other) noexcept
      : category_(other.category_), name_(std::move(other.name_)), args_(std::move(other.args_)), start_ns_(other.start_ns_),
        thread_start_ns_(other.thread_start_ns_), active_(std::exchange(other.active_, false)), observer_(std::exchange(other.observer_, nullptr)) {}
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  Span& operator=(Span&&) = delete;

  // Adds members to the arguments (recorded at the end, so results can be added).
  void add_args(std::string_view members);
  bool active() const { return active_; }
  // Ends the slice now, before the destructor would.
  void close() {
    if (active_) record();
    if (observer_ != nullptr) std::exchange(observer_, nullptr)->closed();
  }

 private:
  void begin(std::string_view category, std::string_view name);
  void record();
  void observe(std::string_view category, std::string_view name) {
    if (detail::t_observer != nullptr) observer_ = detail::t_observer, observer_->opened(category, name);
  }

  std::string_view category_;
  std::string name_, args_;
  std::int64_t start_ns_ = 0, thread_start_ns_ = -1;
  bool active_ = false;
  Observer* observer_ = nullptr;  // told when this span closes
};

// A JSON string literal of `text` (quoted, escaped), for span arguments.
std::string quote(std::string_view text);

}  // namespace nax::trace
