#pragma once
// safetensors files (Hugging Face's format: an 8-byte little-endian header length, a JSON header
// of name -> {dtype, shape, data_offsets} plus "__metadata__", then the tensors' bytes), written
// and read one tensor at a time. nax adds to the metadata "nax.checksum", a checksum of the whole
// file (length, header and data) with the checksum's own 16 digits read as zeros, and "nax.axes",
// each tensor's named axes ({"w": [["embed", 4], ["out", 8]]} as a JSON string), so that a read
// naming them in another order permutes them instead of reinterpreting the bytes.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nax/tensor/tensor.h"

namespace nax::checkpoint {

using Metadata = std::map<std::string, std::string>;

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> dims;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data region (filled in by the writer)
  // Stored as IEEE half (safetensors "F16", as Hugging Face models often are), a type nax has no
  // tensors of: `dtype` is then f32, what the reader converts it to and the writer converts from.
  bool f16 = false;
  // The global tensor's axes (names and sizes, in memory order) where the file records them
  // ("nax.axes"); empty in files without them (Hugging Face's, nax's own before it wrote them).
  std::vector<Axis> axes = {};
  std::uint64_t nbytes() const { return end - begin; }
};

// The safetensors name of a dtype ("F32", "F64", "BF16", "I32"), and of a stored tensor ("F16" too).
std::string safetensors_dtype(DType dtype);
std::string safetensors_dtype(const TensorInfo& info);

// Whether a file must carry nax's checksum: nax's own checkpoints must (a missing one is refused);
// a file nax did not write (a Hugging Face model's) is read without one, every other check kept;
// `verified`: the bytes were just checked against another record (a step folder's manifest,
// verify_step_folder), so the file is not read a second time for its own checksum.
enum class ChecksumPolicy { required, if_present, verified };

// Whether read() accepts NaN and infinities in a floating tensor. A model's weights should hold
// none: with `refuse`, such a tensor is an error naming the file, the tensor and how many it holds.
enum class NonFinitePolicy { allow, refuse };

// Writes the header at once (every tensor's name, dtype, dims and axes when given, in the order
// write() will be called), then each tensor's bytes as it comes: memory stays one tensor, whatever
// the file. The metadata keys "nax.checksum" and "nax.axes" are nax's own (a caller's are replaced).
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<TensorInfo> tensors, const Metadata& metadata = {});
  ~SafetensorsWriter();
  // The next tensor, a host tensor of the announced dtype and element count.
  void write(const Tensor& host);
  // Every tensor written: fills in the checksum, flushes and renames the file into place.
  void commit();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Opens and validates a file: the header length against the file size, the JSON, every entry's
// fields and types, the dtype x shape = byte length of each tensor, offsets ordered and covering
// the data region exactly once, no duplicate names, and the checksum over the whole file. Every
// refusal is a nax::Error naming the file and the field. Reads tensors on demand (thread-safe).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path, ChecksumPolicy checksum = ChecksumPolicy::required,
                             NonFinitePolicy nonfinite = NonFinitePolicy::allow);

  const std::string& path() const;
  const std::vector<TensorInfo>& tensors() const;  // in file order
  const Metadata& metadata() const;
  // The file's own checksum (metadata "nax.checksum", 16 hex digits), when nax wrote it.
  std::optional<std::string> own_checksum() const;
  const TensorInfo* find(const std::string& name) const;
  // The entry `name`, which must exist with these dims (and dtype when given), else an error
  // naming the file and the tensor.
  const TensorInfo& expect(const std::string& name, const std::vector<std::int64_t>& dims) const;
  const TensorInfo& expect(const std::string& name, const std::vector<std::int64_t>& dims, DType dtype) const;
  // Tensor `name` on the host, with its recorded axes (else d0, d1, ...) or, given, as `shape`
  // (same element count, see stored_as); an F16 tensor is converted to f32. Non-finite values
  // follow the reader's NonFinitePolicy.
  Tensor read(const std::string& name) const;
  Tensor read(const std::string& name, const Shape& shape) const;
  // The shape read(name, shape) reads the stored elements as: `shape` itself (positionally: files
  // without recorded axes, or a shape whose axes shared with the recorded ones have the same size
  // and the same elements after them, e.g. merged or renamed axes), or the recorded axes, when
  // `shape` names them in another order (read then permutes them into `shape`'s order). Any other
  // shape naming a recorded axis is refused naming both (it would read the data transposed).
  Shape stored_as(const std::string& name, const Shape& shape) const;

 private:
  Tensor read_as(const TensorInfo& info, const Shape& shape) const;  // the stored elements in order

  struct State;
  std::shared_ptr<const State> state_;
};

// Whole-file conveniences: host tensors with their axes as they are (their names recorded).
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const Metadata& metadata = {});
std::map<std::string, Tensor> load_safetensors(const std::string& path, Metadata* metadata = nullptr);

}  // namespace nax::checkpoint
