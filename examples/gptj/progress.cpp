#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace gptj {

namespace {
std::string clipped(const std::string& line) {
  return line.size() <= Progress::kMaxLine ? line : line.substr(0, Progress::kMaxLine - 3) + "...";
}
}  // namespace

Progress::Progress(bool quiet, std::int64_t total) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) != 0), total_(total) {}

void Progress::update(std::int64_t step, const std::string& line) {
  if (quiet_) return;
  if (tty_) {
    fmt::print(stderr, "\r{:<90}", clipped(line));
    live_ = true;
  } else {
    const auto now = std::chrono::steady_clock::now();
    if (!printed_ || now - last_ >= std::chrono::seconds(1) || step + 1 == total_) {
      fmt::print(stderr, "{}\n", clipped(line));
      last_ = now, printed_ = true;
    }
  }
  std::fflush(stderr);
}

void Progress::message(const std::string& text) {
  if (quiet_) return;
  finish();
  fmt::print(stderr, "{}\n", text);
}

void Progress::finish() {
  if (!live_) return;
  fmt::print(stderr, "\n");
  live_ = false;
}

}  // namespace gptj
