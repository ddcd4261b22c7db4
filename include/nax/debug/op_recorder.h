#pragma once
// The op recorder: while alive on a shard's thread, every op that thread runs is recorded in program
// order with the values it made, copied to the host: the raw material of the mesh-comparison
// locator (nax/debug/locator.h). Off, the ops pay one thread-local pointer test.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "nax/core/dtype.h"
#include "nax/core/shape.h"
#include "nax/core/vary.h"

namespace nax::debug {

// An op's result as one device holds it. Values are read as f64 (exact for f32, bf16 and i32).
struct OpValue {
  Shape shape;  // the device's block, named axes, local sizes
  DType dtype = DType::f32;
  VaryType vary;
  std::vector<double> values;
  // Deterministic mode's sum of partial sums (Tensor::partial_terms): the two partial sums it adds,
  // each with its own terms, the tree of adds that psum redoes after adding each leaf over the ranks.
  std::vector<OpValue> terms;
  // Deterministic mode's local mean (a mean over a tensor axis cut over the mesh): the local sum it
  // divided and its count, which pmean finishes as the psum of the sums over the global count.
  std::vector<double> mean_sum;
  std::int64_t mean_count = 0;
};

// One op as one device ran it.
struct OpRecord {
  std::size_t index = 0;     // position in the device's sequence
  std::string op;            // the name the op gives its trace slice: "dot", "add", "layer_norm", "psum", ...
  bool collective = false;   // a collective (its slice category is "collective")
  std::string context;       // the enclosing slices that are not ops, outermost first: "step/backward"
  // Its result: the last tensor it made that is still held when it returns (what it saved for its
  // backward was made before). None when it made no new tensor (a collective over one device
  // returns its input) or was not read (`unread`).
  std::vector<OpValue> values;
  std::string unread;        // why its values were not read, when they were not ("a started collective")
};

// Records on the calling thread from construction to destruction: only the outermost ops (a dot's
// internal transpose is part of the dot), the backward's ops too (context ".../backward" under
// gptj's phases). One recorder per thread at a time.
class OpRecorder {
 public:
  OpRecorder();
  ~OpRecorder();
  OpRecorder(const OpRecorder&) = delete;
  OpRecorder& operator=(const OpRecorder&) = delete;

  const std::vector<OpRecord>& records() const;
  // The records so far, leaving none.
  std::vector<OpRecord> take();

  struct Observer;

 private:
  std::unique_ptr<Observer> observer_;
};

}  // namespace nax::debug
