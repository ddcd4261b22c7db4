#include "checkpoint/agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "nax/autodiff/autodiff.h"
#include "nax/ops/collectives.h"
#include "nax/ops/ops.h"

namespace nax::checkpoint::detail {

namespace {

constexpr std::size_t kTextBytes = 240;  // of each device's differing entry, in the message

// FNV-1a over the text, cut to 48 bits so that it is exact in an f64.
double hash48(std::string_view text, std::uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<double>(h >> 16);
}

double hash48(const std::vector<std::string>& entries) {
  std::string joined = fmt::format("{}\n", entries.size());
  for (const auto& e : entries) joined += e + '\n';
  return hash48(joined);
}

// Every device's values of `mine` (the same length everywhere), one row per device in group rank
// order over all the mesh axes.
std::vector<std::vector<double>> gathered(const Names& all, const std::vector<double>& mine) {
  const Tensor local = pvary(from_vector(Shape{{"value", static_cast<std::int64_t>(mine.size())}}, mine), all);
  const std::vector<double> flat = all_gather_invariant_stacked(local, all, "device").to_vector<double>();
  std::vector<std::vector<double>> rows;
  for (std::size_t at = 0; at < flat.size(); at += mine.size()) rows.emplace_back(flat.begin() + at, flat.begin() + at + mine.size());
  return rows;
}

// The first entry whose hash differs between two devices (the shorter lists padded), or -1.
std::ptrdiff_t first_difference(const Names& all, const std::vector<std::string>& entries) {
  const auto longest = static_cast<std::size_t>(pmax(pvary(scalar(static_cast<double>(entries.size()), DType::f64), all), all).item());
  std::vector<double> hashes(longest, -1.0);
  for (std::size_t k = 0; k < entries.size(); ++k) hashes[k] = hash48(entries[k]);
  const auto rows = gathered(all, hashes);
  for (std::size_t k = 0; k < longest; ++k)
    for (const auto& row : rows)
      if (row[k] != rows[0][k]) return static_cast<std::ptrdiff_t>(k);
  return -1;
}

// Every device's text (cut to kTextBytes), exchanged as bytes.
std::vector<std::string> texts_of(const Names& all, const std::string& text) {
  std::vector<double> bytes(kTextBytes, 0.0);
  for (std::size_t i = 0; i < std::min(text.size(), kTextBytes); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  std::vector<std::string> out;
  for (const auto& row : gathered(all, bytes)) {
    std::string t;
    for (double b : row) {
      if (b == 0) break;
      t += static_cast<char>(static_cast<unsigned char>(b));
    }
    out.push_back(t);
  }
  return out;
}

// "'x' f32[a=4] on devices 0, 2; 'y' f32[a=4] on device 1", the texts in the order of their first device.
std::string by_text(const std::vector<std::string>& texts, const std::vector<int>& devices) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> holders;
  for (std::size_t r = 0; r < texts.size(); ++r) {
    if (!holders.contains(texts[r])) order.push_back(texts[r]);
    holders[texts[r]].push_back(devices[r]);
  }
  std::vector<std::string> parts;
  for (const auto& t : order)
    parts.push_back(fmt::format("{} on device{} {}", t, holders[t].size() > 1 ? "s" : "", fmt::join(holders[t], ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace

void require_same_on_every_device(Shard& s, std::string_view op, std::string_view what, const std::vector<std::string>& entries) {
  NoGrad no_grad;
  const Names all(s.mesh().axis_names());
  const double h = hash48(entries);
  // The largest and the smallest hash agree only when all do.
  const auto extremes = pmax(pvary(from_vector(Shape{{"hash", 2}}, std::vector<double>{h, -h}), all), all).to_vector<double>();
  if (extremes[0] == h && extremes[1] == -h) return;
  const std::ptrdiff_t k = first_difference(all, entries);
  const auto at = static_cast<std::size_t>(k);
  const std::string mine = k < 0 ? "(the same entries)" : at < entries.size() ? entries[at] : "nothing (a shorter list)";
  fail(op, "the devices pass different {}; every device must pass the same: {}", what,
       by_text(texts_of(all, mine), s.mesh().group(s.device(), s.mesh().axis_names())));
}

std::string tensor_entry(std::size_t k, const std::string& name, std::string_view dtype, const Shape& global,
                         const std::vector<std::int64_t>& stored) {
  std::vector<std::int64_t> dims;
  for (const auto& a : global.axes()) dims.push_back(a.size);
  const std::string as = stored.empty() || stored == dims ? "" : fmt::format(" stored as [{}]", fmt::join(stored, ", "));
  return fmt::format("tensor {}: '{}' {}{}{}", k, name, dtype, global.str(), as);
}

}  // namespace nax::checkpoint::detail
