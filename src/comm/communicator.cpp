#include "nax/comm/communicator.h"

namespace nax {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::size_t total_calls(const CommStats& s) {
  std::size_t n = 0;
  for (auto c : s.calls) n += c;
  return n;
}

std::size_t total_bytes(const CommStats& s) {
  std::size_t n = 0;
  for (auto b : s.bytes) n += b;
  return n;
}

CommStats operator-(const CommStats& a, const CommStats& b) {
  CommStats d;
  for (std::size_t k = 0; k < d.calls.size(); ++k) {
    d.calls[k] = a.calls[k] - b.calls[k];
    d.bytes[k] = a.bytes[k] - b.bytes[k];
  }
  return d;
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
