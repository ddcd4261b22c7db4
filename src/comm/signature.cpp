#include "comm/signature.h"

#include <fmt/format.h>

namespace nax {

namespace {
constexpr std::uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;
std::uint64_t mix(std::uint64_t hash, std::uint64_t value) { return (hash ^ value) * kFnvPrime; }
}  // namespace

std::string CollectiveSignature::str() const {
  std::string what;
  switch (kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter:
      what = fmt::format("{}({}, {} x {})", collective_name(kind), reduce_op_name(static_cast<ReduceOp>(detail)), dtype_name(dtype), count);
      break;
    case CollectiveKind::broadcast:
      what = fmt::format("broadcast(root {}, {} x {})", detail, dtype_name(dtype), count);
      break;
    case CollectiveKind::barrier:
      what = "barrier()";
      break;
    default:
      what = fmt::format("{}({} x {})", collective_name(kind), dtype_name(dtype), count);
  }
  return origin == nullptr || origin->empty() ? what : fmt::format("{} [{}]", *origin, what);
}

std::uint64_t CollectiveSignature::hash() const {
  std::uint64_t h = kFnvOffset;
  h = mix(h, static_cast<std::uint64_t>(kind));
  h = mix(h, static_cast<std::uint64_t>(dtype));
  h = mix(h, count);
  h = mix(h, static_cast<std::uint64_t>(static_cast<std::int64_t>(detail)));
  h = mix(h, pairs_hash);
  return mix(h, call_site);
}

std::uint64_t hash_pairs(const std::vector<std::pair<int, int>>& pairs) {
  std::uint64_t hash = kFnvOffset;
  for (auto [s, d] : pairs) hash = mix(hash, static_cast<std::uint64_t>(s * 65536 + d + 1));
  return hash;
}

std::string mismatch_message(const std::string& group, int device_a, const CollectiveSignature& first, int device_b,
                             const CollectiveSignature& other) {
  std::string hint = backward_hint(first);
  if (hint.empty()) hint = backward_hint(other);
  return fmt::format("collective mismatch in {}: device {} called {} but device {} called {}{}", group, device_a, first.str(), device_b,
                     other.str(), hint);
}

std::string backward_hint(const CollectiveSignature& call) {
  if (call.origin == nullptr || call.origin->find(" in the backward of ") == std::string::npos) return {};
  return "; a backward runs a collective's transpose only on the devices where the collective's result took a gradient: a result "
         "that some devices use and others leave unused (code that depends on the device's coordinate) puts them out of step, so "
         "use it on every device (attend a fully masked block, add a zero term)";
}

}  // namespace nax
