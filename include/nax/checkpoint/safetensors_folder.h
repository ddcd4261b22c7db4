#pragma once
// A model folder's weights as Hugging Face lays them out: one `model.safetensors`, or shards
// `model-0000k-of-0000n.safetensors` listed by `model.safetensors.index.json` ({"weight_map":
// {tensor: file}}). Read one tensor at a time from whichever file holds it; written the same way,
// sharded above a size, one global tensor at a time.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nax/checkpoint/safetensors.h"
#include "nax/checkpoint/sharded.h"

namespace nax::checkpoint {

inline constexpr const char* kSingleWeightsFile = "model.safetensors";
inline constexpr const char* kWeightsIndexFile = "model.safetensors.index.json";

class SafetensorsFolder {
 public:
  // Opens `dir`'s weights: model.safetensors, or the index and each shard it names (each validated
  // as SafetensorsReader does, with `checksum`). Refused with a nax::Error naming the file and the
  // tensor: a folder holding PyTorch pickles only (pytorch_model.bin: the message says how to
  // convert), both a single file and an index, an index that is not {"weight_map": {name: file}},
  // a shard name with a folder in it, a tensor the index maps to a file that does not hold it, a
  // tensor in a shard that the index does not map to it.
  // `nonfinite` applies to every tensor read (SafetensorsReader).
  SafetensorsFolder(const std::string& dir, ChecksumPolicy checksum, NonFinitePolicy nonfinite = NonFinitePolicy::allow);

  const std::string& dir() const { return dir_; }
  std::vector<std::string> files() const;  // the safetensors files' paths, in name order
  std::vector<TensorInfo> tensors() const;  // every tensor, file by file
  std::size_t size() const { return owner_.size(); }
  const TensorInfo* find(const std::string& name) const;
  // The file holding `name`, or an error naming the folder and the tensor.
  const SafetensorsReader& file_of(const std::string& name) const;
  // Tensor `name` on the host as `shape`, converted to `dtype` (between the floating types F16,
  // BF16, F32 and F64; other conversions are refused naming the tensor).
  Tensor read(const std::string& name, const Shape& shape, DType dtype) const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::size_t> owner_;  // tensor name -> index in files_
};

// Checks that `folder` holds each tensor with its stored dims, in any floating dtype.
void expect_tensors(const SafetensorsFolder& folder, const std::vector<ShardedRead>& tensors);

// This device's blocks of the tensors, converted to `dtype` and cut by `rules` (as load_sharded).
std::vector<Tensor> load_sharded(Shard& s, const SafetensorsFolder& folder, const std::vector<ShardedRead>& tensors, const AxisRules& rules,
                                 DType dtype);

// The safetensors dtype a folder is written in: "F32", "BF16" or "F16" (also accepted in lower
// case and as f32/bf16/f16/float16/bfloat16/float32), or an error naming `flag`.
std::string parse_stored_dtype(const std::string& name, const std::string& flag);

// A tensor to write: name, global shape, stored dims (empty: the global shape's) and a function
// making this device's f32 block when its turn comes, so that a conversion holds one at a time.
struct LazyShardedTensor {
  std::string name;
  Shape global;
  std::vector<std::int64_t> stored_dims;
  std::function<Tensor()> block;
};

// Collective, as save_sharded: writes `tensors` (f32 blocks) into the new or empty folder `dir`
// as Hugging Face does, stored as `stored` (parse_stored_dtype): all in model.safetensors when
// they take at most `max_file_bytes`, else in shards model-0000k-of-0000n.safetensors of at most
// that size each (a larger tensor alone in its file) and model.safetensors.index.json, written
// last. Returns the files written (names in `dir`).
std::vector<std::string> save_sharded_folder(Shard& s, const std::string& dir, const std::vector<LazyShardedTensor>& tensors,
                                             const std::string& stored, std::uint64_t max_file_bytes, const Metadata& metadata = {});

}  // namespace nax::checkpoint
