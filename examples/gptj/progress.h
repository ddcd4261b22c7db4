#pragma once
// Progress of a long command on stderr: on a terminal one live line rewritten in place; otherwise
// (a log file, a pipe) plain lines, at most one per second and always the last step's, none
// longer than kMaxLine characters.
#include <chrono>
#include <cstdint>
#include <string>

namespace gptj {

class Progress {
 public:
  static constexpr std::size_t kMaxLine = 300;

  // `quiet`: print nothing. `total`: the number of steps.
  Progress(bool quiet, std::int64_t total);
  // The line for step `step` (0-based) of `total`.
  void update(std::int64_t step, const std::string& line);
  // A message on a line of its own (after the live line, if any).
  void message(const std::string& text);
  // Ends the live line (on a terminal).
  void finish();

 private:
  bool quiet_, tty_;
  std::int64_t total_;
  bool live_ = false;  // a live line is on the terminal
  std::chrono::steady_clock::time_point last_{};
  bool printed_ = false;
};

}  // namespace gptj
