#include "core/peak_trace.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <set>

namespace nax {

namespace {

std::atomic<int> traces_made{0};

// The path with "%p" replaced by the process id (one file per process under mpirun).
std::string with_pid(std::string path) {
  const std::string pid = std::to_string(getpid());
  for (std::size_t at = path.find("%p"); at != std::string::npos; at = path.find("%p", at + pid.size())) path.replace(at, 2, pid);
  return path;
}

// A frame as "function (module)" where dladdr or addr2line can name it, else its address.
class Symbolizer {
 public:
  explicit Symbolizer(const std::set<void*>& addresses) {
    std::map<std::string, std::vector<std::pair<void*, std::uintptr_t>>> by_module;
    for (void* a : addresses) {
      Dl_info info{};
      if (dladdr(a, &info) == 0 || info.dli_fname == nullptr) continue;
      // (a return address points after the call: look one byte back to name the calling line)
      by_module[info.dli_fname].push_back({a, reinterpret_cast<std::uintptr_t>(a) - reinterpret_cast<std::uintptr_t>(info.dli_fbase) - 1});
      if (info.dli_sname != nullptr) names_[a] = demangled(info.dli_sname);
    }
    constexpr std::size_t kPerCall = 256;  // addresses per addr2line command line
    for (const auto& [module, frames] : by_module)
      for (std::size_t i = 0; i < frames.size(); i += kPerCall)
        ask_addr2line(module, {frames.begin() + static_cast<std::ptrdiff_t>(i),
                               frames.begin() + static_cast<std::ptrdiff_t>(std::min(frames.size(), i + kPerCall))});
  }

  std::string name(void* a) const {
    const auto it = names_.find(a);
    if (it != names_.end()) return it->second;
    char text[32];
    std::snprintf(text, sizeof text, "%p", a);
    return text;
  }

 private:
  static std::string demangled(const char* symbol) {
    int status = 0;
    char* d = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
    std::string out = status == 0 && d != nullptr ? d : symbol;
    std::free(d);
    return out;
  }

  // addr2line -f -C names each offset's function and line (two lines each); absent, names stay as dladdr gave them.
  void ask_addr2line(const std::string& module, const std::vector<std::pair<void*, std::uintptr_t>>& frames) {
    std::string command = "addr2line -f -C -e '" + module + "'";
    char hex[24];
    for (const auto& [a, offset] : frames) {
      std::snprintf(hex, sizeof hex, " 0x%jx", static_cast<std::uintmax_t>(offset));
      command += hex;
    }
    command += " 2>/dev/null";
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return;
    char function[4096], where[4096];
    for (const auto& [a, offset] : frames) {
      if (std::fgets(function, sizeof function, pipe) == nullptr || std::fgets(where, sizeof where, pipe) == nullptr) break;
      std::string f(function), w(where);
      while (!f.empty() && f.back() == '\n') f.pop_back();
      while (!w.empty() && w.back() == '\n') w.pop_back();
      if (f != "??") names_[a] = f + (w.starts_with("??") ? "" : "  " + w.substr(w.rfind('/') == std::string::npos ? 0 : w.rfind('/') + 1));
    }
    pclose(pipe);
  }

  std::map<void*, std::string> names_;
};

}  // namespace

std::unique_ptr<PeakTrace> PeakTrace::from_environment() {
  const char* path = std::getenv("NAX_MEMORY_PEAK_TRACE");
  if (path == nullptr || *path == '\0') return nullptr;
  const int index = traces_made.fetch_add(1);
  const std::string file = with_pid(path);
  return std::make_unique<PeakTrace>(index == 0 ? file : file + "." + std::to_string(index));
}

PeakTrace::~PeakTrace() {
  try {
    write();
  } catch (...) {  // a debugging aid: the program's end is not its business
  }
}

void PeakTrace::allocated(void* ptr, std::size_t bytes) {
  try {
    Live& l = live_[ptr];
    l.bytes = bytes;
    l.depth = backtrace(l.frames.data(), kFrames);
  } catch (const std::bad_alloc&) {  // untraced, not lost: the allocation itself stands
  }
}

void PeakTrace::freed(void* ptr) { live_.erase(ptr); }

// Noting copies every live allocation: done again only when the peak has grown by 1/256 of itself
// (at most some 1400 notes from 1 MB to 256 GB), so the note may be a little below the peak.
void PeakTrace::peak(std::size_t in_use) {
  peak_ = in_use;
  if (in_use < noted_ + noted_ / 256 + 1) return;
  noted_ = in_use;
  at_peak_.clear();
  for (const auto& [ptr, l] : live_) at_peak_.push_back(l);
}

void PeakTrace::reset(std::size_t in_use) {
  peak_ = noted_ = 0;
  at_peak_.clear();
  peak(in_use);
}

void PeakTrace::write() const {
  FILE* out = std::fopen(path_.c_str(), "w");
  if (out == nullptr) return;
  std::map<std::vector<void*>, std::pair<std::size_t, std::size_t>> by_stack;  // bytes, count
  std::set<void*> addresses;
  for (const Live& l : at_peak_) {
    std::vector<void*> stack(l.frames.begin(), l.frames.begin() + l.depth);
    auto& [bytes, count] = by_stack[stack];
    bytes += l.bytes, count += 1;
    addresses.insert(stack.begin(), stack.end());
  }
  std::vector<std::pair<std::vector<void*>, std::pair<std::size_t, std::size_t>>> sorted(by_stack.begin(), by_stack.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  const Symbolizer symbols(addresses);
  std::fprintf(out, "peak %zu bytes in use; noted at %zu bytes: %zu live allocations from %zu call stacks, largest first\n", peak_,
               noted_, at_peak_.size(), sorted.size());
  for (const auto& [stack, totals] : sorted) {
    std::fprintf(out, "\n%zu bytes in %zu allocations (%.1f%% of the note)\n", totals.first, totals.second,
                 noted_ > 0 ? 100.0 * static_cast<double>(totals.first) / static_cast<double>(noted_) : 0.0);
    for (void* frame : stack) std::fprintf(out, "    %s\n", symbols.name(frame).c_str());
  }
  std::fclose(out);
}

}  // namespace nax
