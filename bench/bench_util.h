#pragma once
// Small helpers shared by the benchmark programs: timing with steady_clock, medians, command-line
// values, and JSON written by hand (objects of numbers and strings, arrays of objects).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nax/core/error.h>

namespace bench {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point start, Clock::time_point stop) {
  return std::chrono::duration<double>(stop - start).count();
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle), values.end());
  if (values.size() % 2 == 1) return values[middle];
  const double upper = values[middle];
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return (lower + upper) / 2;
}

// Seconds taken by one call of `fn`.
template <typename Fn>
double seconds_of(Fn&& fn) {
  const auto start = Clock::now();
  fn();
  return seconds_between(start, Clock::now());
}

// Seconds taken by one call of `fn`, as the median of `repetitions` timed calls.
template <typename Fn>
double median_seconds(int repetitions, Fn&& fn) {
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(repetitions));
  for (int r = 0; r < repetitions; ++r) times.push_back(seconds_of(fn));
  return median(std::move(times));
}

// --- command line ---

// The value after flag argv[i] (advancing i), or an error naming the flag.
inline std::string flag_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) nax::fail(argv[i], "needs a value (try --help)");
  return argv[++i];
}

inline std::int64_t parse_integer(const std::string& text, std::string_view flag) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) nax::fail(flag, "'{}' is not an integer", text);
  return value;
}

// "2,4,8" -> {2, 4, 8}
inline std::vector<std::int64_t> parse_integer_list(const std::string& text, std::string_view flag) {
  std::vector<std::int64_t> values;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = std::min(text.find(',', begin), text.size());
    values.push_back(parse_integer(text.substr(begin, comma - begin), flag));
    begin = comma + 1;
  }
  return values;
}

// --- JSON ---

inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<int>(c));
    else out += c;
  }
  return out + "\"";
}

inline std::string json_number(double value) { return std::isfinite(value) ? fmt::format("{}", value) : "null"; }

// One JSON object, its members in the order they were added.
class JsonObject {
 public:
  JsonObject& add(std::string_view key, double value) { return add_raw(key, json_number(value)); }
  JsonObject& add(std::string_view key, std::int64_t value) { return add_raw(key, fmt::format("{}", value)); }
  JsonObject& add(std::string_view key, int value) { return add_raw(key, fmt::format("{}", value)); }
  JsonObject& add(std::string_view key, bool value) { return add_raw(key, value ? "true" : "false"); }
  JsonObject& add(std::string_view key, std::string_view value) { return add_raw(key, json_string(value)); }
  JsonObject& add(std::string_view key, const char* value) { return add_raw(key, json_string(value)); }
  // `json` must already be valid JSON (an object or an array).
  JsonObject& add_raw(std::string_view key, std::string json) {
    members_.emplace_back(json_string(key), std::move(json));
    return *this;
  }
  std::string str() const {
    std::vector<std::string> parts;
    for (const auto& [key, value] : members_) parts.push_back(fmt::format("{}: {}", key, value));
    return fmt::format("{{{}}}", fmt::join(parts, ", "));
  }

 private:
  std::vector<std::pair<std::string, std::string>> members_;
};

inline std::string json_array(const std::vector<JsonObject>& items) {
  std::vector<std::string> parts;
  for (const auto& item : items) parts.push_back("\n    " + item.str());
  return fmt::format("[{}\n  ]", fmt::join(parts, ","));
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) nax::fail("json", "cannot open '{}' for writing", path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !ok) nax::fail("json", "could not write '{}'", path);
}

}  // namespace bench
