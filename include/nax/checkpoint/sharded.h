#pragma once
// Save and load named global tensors from per-shard code, on any mesh: a file saved on one mesh
// loads on any other. Both stream one tensor at a time: a save gathers one global tensor, the
// writing device appends it to the file and drops it; a load reads one global tensor and keeps
// this device's block. No device holds more than one global tensor at once, and under mpirun no
// process gathers the whole model.
#include <cstdint>
#include <string>
#include <vector>

#include "nax/checkpoint/safetensors.h"
#include "nax/nn/parameters.h"
#include "nax/runtime/runtime.h"

namespace nax::checkpoint {

// Which devices hold a tensor: those at coordinate `index` of mesh axis `axis` (a pipeline stage's
// parameters, held by that stage alone, Varying over the axis); empty `axis`: every device.
struct HeldBy {
  std::string axis;
  int index = 0;
  bool everywhere() const { return axis.empty(); }
  bool here(const Shard& s) const;  // whether this device holds the tensor
};

struct ShardedTensor {
  std::string name;
  Tensor block;   // this device's block (Split or Invariant over the mesh axes; Varying only over held_by.axis)
  Shape global;   // the global shape the blocks make up
  // The dims it is stored with (same element count and row-major order, e.g. heads and
  // head_dim merged); empty: the global shape's sizes.
  std::vector<std::int64_t> stored_dims = {};
  // Devices that do not hold it pass an undefined block: the holders' block (Split or Invariant
  // over every mesh axis but held_by.axis) travels to the writer.
  HeldBy held_by = {};
  DType dtype = DType::f32;  // a held tensor's dtype, which every device announces
};

// Collective: writes `path` atomically; only `writer` (a device of the mesh) touches the file, with
// its `path` and `metadata`. Every device must pass the same tensors (names, in the same order,
// global shapes, stored dims and dtypes) and writer: checked first with one small all-reduce (a
// hash), and a difference is an error on every device naming the first tensor that differs and
// each device's version of it. The file records each tensor's axes (nax.axes).
void save_sharded(Shard& s, const std::string& path, const std::vector<ShardedTensor>& tensors, const Metadata& metadata = {},
                  int writer = 0);

struct ShardedRead {
  std::string name;
  Shape global;  // the global shape to read the stored tensor as
  std::vector<std::int64_t> stored_dims = {};  // as in ShardedTensor
  HeldBy held_by = {};  // only the holders read it; elsewhere load_sharded returns an undefined tensor
};

// The entry `t` reads: with t's stored dims, or, where the file records the tensor's axes and
// t.global names them in another order, with the file's own dims (the read permutes them:
// SafetensorsReader::stored_as). Else an error naming the file and the tensor.
const TensorInfo& expect_tensor(const SafetensorsReader& file, const ShardedRead& t);

// Checks each tensor with expect_tensor, and its dtype (before any work on the mesh).
void expect_tensors(const SafetensorsReader& file, const std::vector<ShardedRead>& tensors, DType dtype);

// This device's blocks of the tensors, cut by `rules` (call expect_tensors first, once); a tensor
// held by some devices is read by them alone and made Varying over held_by.axis. Read by
// axis name where the file records names (permuted when `global` orders them otherwise), else
// positionally. Collective: every device must pass the same tensors (checked as save_sharded does).
std::vector<Tensor> load_sharded(Shard& s, const SafetensorsReader& file, const std::vector<ShardedRead>& tensors, const AxisRules& rules);

// A model's parameters in two calls: save (collective) and load on any mesh (collective too: the
// same specs on every device).
void save_parameters(Shard& s, const std::string& path, const nn::Parameters& params, const Metadata& metadata = {});
nn::Parameters load_parameters(Shard& s, const SafetensorsReader& file, const std::vector<nn::ParamSpec>& specs, const AxisRules& rules);

}  // namespace nax::checkpoint
