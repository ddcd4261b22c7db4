#include "nax/comm/communicator.h"

#include <fmt/format.h>

#include <numeric>

#include "comm/element_at.h"
#include "nax/core/error.h"

namespace nax {

namespace {
// The path from the last "src/", "tests/", "examples/" or "bench/" on, else the file name.
std::string_view short_path(std::string_view file) {
  std::size_t best = std::string_view::npos;
  for (std::string_view root : {"src/", "tests/", "examples/", "bench/", "include/"}) {
    const std::size_t at = file.rfind(root);
    if (at != std::string_view::npos && (at == 0 || file[at - 1] == '/') && (best == std::string_view::npos || at > best)) best = at;
  }
  if (best != std::string_view::npos) return file.substr(best);
  const std::size_t slash = file.rfind('/');
  return slash == std::string_view::npos ? file : file.substr(slash + 1);
}
}  // namespace

std::string CallSite::str() const { return fmt::format("{}:{}:{}", short_path(file), line, column); }

std::string CallSite::label(std::string_view call) const {
  if (line == 0) return std::string(call);
  if (backward_of == nullptr) return fmt::format("{} at {}", call, str());
  if (transposes == 0) return fmt::format("{} in the backward of {} at {}", call, backward_of, str());
  return fmt::format("{} in the backward of {} at {} (the group's call {})", call, backward_of, str(), transposes);
}

std::uint64_t CallSite::hash() const {
  if (line == 0) return 0;
  constexpr std::uint64_t kPrime = 1099511628211ull;
  std::uint64_t h = 1469598103934665603ull;
  for (char c : short_path(file)) h = (h ^ static_cast<unsigned char>(c)) * kPrime;
  h = (h ^ line) * kPrime;
  h = (h ^ column) * kPrime;
  h = (h ^ (backward_of != nullptr ? 1u : 0u)) * kPrime;
  h = (h ^ transposes) * kPrime;
  return (h ^ arguments) * kPrime;
}

void check_permute_pairs(const std::vector<std::pair<int, int>>& pairs, int n, std::string_view op, std::string_view group,
                         const std::function<std::string()>& detail) {
  auto suffix = [&] { return detail ? ": " + detail() : std::string(); };
  std::vector<char> src_seen(static_cast<std::size_t>(n)), dst_seen(static_cast<std::size_t>(n));
  for (auto [src, dst] : pairs) {
    if (src < 0 || src >= n || dst < 0 || dst >= n)
      fail(op, "pair ({}, {}) is out of range for the {} ranks of {}{}", src, dst, n, group, suffix());
    if (src_seen[static_cast<std::size_t>(src)]++) fail(op, "rank {} of {} is the source of two pairs{}", src, group, suffix());
    if (dst_seen[static_cast<std::size_t>(dst)]++) fail(op, "rank {} of {} is the destination of two pairs{}", dst, group, suffix());
  }
}

std::size_t total_calls(const CommStats& s) { return std::accumulate(s.calls.begin(), s.calls.end(), std::size_t{0}); }
std::size_t total_bytes(const CommStats& s) { return std::accumulate(s.bytes.begin(), s.bytes.end(), std::size_t{0}); }

CommStats operator-(const CommStats& a, const CommStats& b) {
  CommStats d;
  for (std::size_t k = 0; k < d.calls.size(); ++k) {
    d.calls[k] = a.calls[k] - b.calls[k];
    d.bytes[k] = a.bytes[k] - b.bytes[k];
  }
  return d;
}

CommStats& operator+=(CommStats& a, const CommStats& b) {
  for (std::size_t k = 0; k < a.calls.size(); ++k) {
    a.calls[k] += b.calls[k];
    a.bytes[k] += b.bytes[k];
  }
  return a;
}

namespace {
class FinishedRequest final : public Communicator::Request {
 public:
  void wait() override {}
};
}  // namespace

std::unique_ptr<Communicator::Request> Communicator::start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                                                      ReduceOp op, const Call& call) {
  all_reduce(send, recv, count, dtype, op, call);
  return std::make_unique<FinishedRequest>();
}

void Communicator::all_reduce_parts(const std::vector<const void*>& parts, void* recv, std::size_t count, DType dtype, ReduceOp op,
                                    const Call& call) {
  for (std::size_t i = 0; i < parts.size(); ++i) all_reduce(parts[i], comm::element_at(recv, i * count, dtype), count, dtype, op, call);
}

std::unique_ptr<Communicator::Request> Communicator::start_all_reduce_parts(const std::vector<const void*>& parts, void* recv,
                                                                            std::size_t count, DType dtype, ReduceOp op, const Call& call) {
  all_reduce_parts(parts, recv, count, dtype, op, call);
  return std::make_unique<FinishedRequest>();
}

std::unique_ptr<Communicator::Request> Communicator::start_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const Call& call) {
  all_gather(send, recv, count, dtype, call);
  return std::make_unique<FinishedRequest>();
}

std::unique_ptr<Communicator::Request> Communicator::start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                                                          ReduceOp op, const Call& call) {
  reduce_scatter(send, recv, count, dtype, op, call);
  return std::make_unique<FinishedRequest>();
}

std::unique_ptr<Communicator::Request> Communicator::start_permute(const void* send, void* recv, std::size_t count, DType dtype,
                                                                   const std::vector<std::pair<int, int>>& pairs, const Call& call) {
  permute(send, recv, count, dtype, pairs, call);
  return std::make_unique<FinishedRequest>();
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_to_all: return "all_to_all";
    case CollectiveKind::permute: return "permute";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
  }
  return "?";
}

}  // namespace nax
