#pragma once
// The mesh-comparison locator: the same per-shard program run on two meshes, every op recorded
// (nax/debug/op_recorder.h) and its values rebuilt as global tensors on the host, then compared op
// by op: the first op whose global value differs is reported, so that a sharding bug is located,
// not only detected. Exact equality is what to expect in deterministic mode
// (RuntimeOptions::deterministic); docs/locator.md.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nax/core/mesh.h"
#include "nax/debug/op_recorder.h"
#include "nax/runtime/runtime.h"

namespace nax::debug {

// What every device of one mesh recorded.
struct MeshRecords {
  Mesh mesh;
  std::vector<std::vector<OpRecord>> devices;  // by device
};

// Runs `program` on every device of `runtime` with an OpRecorder around it (all in this process:
// Runtime::local).
MeshRecords record_ops(Runtime& runtime, const std::function<void(Shard&)>& program);

// The first difference found, or none.
struct Finding {
  bool found = false;
  // "value"; "invariant" (devices of one mesh disagree on a value typed Invariant); "shape" (the
  // meshes made different global shapes); "program" (different ops)
  std::string kind;
  std::string mesh;              // for "invariant": the mesh whose devices disagree
  std::size_t index = 0;         // the op's position on the first mesh's devices
  std::size_t other_index = 0;   // and on the second's
  std::string op, context;
  std::string shape;             // the global value's shape ("f32[batch=4, vocab=64]")
  std::string devices;           // for per-device values: whose ("mp=1"), else empty
  std::int64_t differing = 0;    // elements that differ
  std::int64_t first = 0;        // the first of them, row-major
  std::string first_at;          // its coordinates ("batch=1, vocab=7")
  double a = 0, b = 0;           // its value on the first and the second mesh
  double max_abs = 0;            // the largest |a - b|
  std::string detail;            // for "program" and "invariant": what differs, in words
};

struct Comparison {
  Finding first;
  std::size_t ops_compared = 0;   // ops whose values were compared
  std::size_t values_compared = 0;
  std::vector<std::string> notes;  // what was skipped, and why (the first 20)
  std::size_t notes_left_out = 0;
};

// Compares the two meshes' records op by op (collectives one mesh ran and the other did not are
// passed over), stopping at the first difference. A value that is exactly a power of two times the
// other everywhere is passed over with a note: the mesh scales it (d loss / d local mean is 1/dp of
// it per device), no rounding does.
Comparison compare_records(const MeshRecords& a, const MeshRecords& b);

// The report gptj compare --meshes prints: the finding, or "no difference in N ops".
std::string describe(const Comparison& c, const std::string& a_name, const std::string& b_name);

}  // namespace nax::debug
