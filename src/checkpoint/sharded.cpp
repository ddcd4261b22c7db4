#include "nax/checkpoint/sharded.h"

#include "checkpoint/agreement.h"
#include "nax/autodiff/autodiff.h"
#include "nax/ops/ops.h"

namespace nax::checkpoint {

namespace {

std::vector<std::int64_t> dims_of(const Shape& s) {
  std::vector<std::int64_t> dims;
  for (const auto& a : s.axes()) dims.push_back(a.size);
  return dims;
}

template <typename T>
std::vector<std::int64_t> stored_dims(const T& t) {
  return t.stored_dims.empty() ? dims_of(t.global) : t.stored_dims;
}

std::int64_t product(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

}  // namespace

void save_sharded(Shard& s, const std::string& path, const std::vector<ShardedTensor>& tensors, const Metadata& metadata, int writer) {
  if (writer < 0 || writer >= s.mesh().size())
    fail("save_sharded", "'{}': writer {} is not a device of mesh {} (devices 0 to {})", path, writer, s.mesh().str(), s.mesh().size() - 1);
  std::vector<std::string> entries{fmt::format("writer: device {}", writer)};
  for (std::size_t k = 0; k < tensors.size(); ++k)
    entries.push_back(detail::tensor_entry(k, tensors[k].name, dtype_name(tensors[k].block.dtype()), tensors[k].global, stored_dims(tensors[k])));
  detail::require_same_on_every_device(s, "save_sharded", fmt::format("tensors to save in '{}' (names in the same order, global shapes, "
                                       "stored dims and dtypes, and the writer)", path), entries);
  std::unique_ptr<SafetensorsWriter> file;
  if (s.device() == writer) {
    std::vector<TensorInfo> infos;
    for (const auto& t : tensors) {
      const auto dims = stored_dims(t);
      if (product(dims) != t.global.numel())
        fail("save_sharded", "'{}': tensor '{}' of global shape {} stored as [{}]: the element counts differ", path, t.name, t.global.str(),
             fmt::join(dims, ", "));
      TensorInfo info{t.name, t.block.dtype(), dims};
      info.axes = t.global.axes();
      infos.push_back(std::move(info));
    }
    file = std::make_unique<SafetensorsWriter>(path, std::move(infos), metadata);
  }
  for (const auto& t : tensors) {
    Tensor global = s.gather(stop_gradient(t.block));  // one global tensor alive at a time
    if (global.shape() != t.global)
      fail("save_sharded", "'{}': tensor '{}' gathers to {}, announced as {}", path, t.name, global.shape().str(), t.global.str());
    if (file) file->write(global);
  }
  if (file) file->commit();
}

const TensorInfo& expect_tensor(const SafetensorsReader& file, const ShardedRead& t) {
  const TensorInfo* info = file.find(t.name);
  const bool permuted = info != nullptr && product(info->dims) == t.global.numel() && file.stored_as(t.name, t.global) != t.global;
  return file.expect(t.name, permuted ? info->dims : stored_dims(t));
}

void expect_tensors(const SafetensorsReader& file, const std::vector<ShardedRead>& tensors, DType dtype) {
  for (const auto& t : tensors) file.expect(t.name, expect_tensor(file, t).dims, dtype);
}

std::vector<Tensor> load_sharded(Shard& s, const SafetensorsReader& file, const std::vector<ShardedRead>& tensors, const AxisRules& rules) {
  std::vector<std::string> entries;
  for (std::size_t k = 0; k < tensors.size(); ++k) entries.push_back(detail::tensor_entry(k, tensors[k].name, "", tensors[k].global, stored_dims(tensors[k])));
  detail::require_same_on_every_device(s, "load_sharded", fmt::format("tensors to load from '{}' (names in the same order, global "
                                       "shapes and stored dims)", file.path()), entries);
  std::vector<Tensor> blocks;
  blocks.reserve(tensors.size());
  for (const auto& t : tensors) blocks.push_back(s.shard(file.read(t.name, t.global), rules));  // the global copy dies here
  return blocks;
}

void save_parameters(Shard& s, const std::string& path, const nn::Parameters& params, const Metadata& metadata) {
  std::vector<ShardedTensor> tensors;
  for (std::size_t i = 0; i < params.size(); ++i) tensors.push_back({params.specs()[i].name, params[i], params.specs()[i].global});
  save_sharded(s, path, tensors, metadata);
}

nn::Parameters load_parameters(Shard& s, const SafetensorsReader& file, const std::vector<nn::ParamSpec>& specs, const AxisRules& rules) {
  std::vector<ShardedRead> reads;
  for (const auto& spec : specs) reads.push_back({spec.name, spec.global});
  for (const auto& r : reads) expect_tensor(file, r);
  return nn::Parameters::from_values(specs, load_sharded(s, file, reads, rules));
}

}  // namespace nax::checkpoint
