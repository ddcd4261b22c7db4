#include "nax/checkpoint/sharded.h"

#include "checkpoint/agreement.h"
#include "nax/autodiff/autodiff.h"
#include "nax/ops/collectives.h"
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

// A held tensor's dtype is announced (the devices that do not hold it have no block to read it from).
DType dtype_of(const ShardedTensor& t) { return t.held_by.everywhere() ? t.block.dtype() : t.dtype; }

std::string held_text(const HeldBy& h) { return h.everywhere() ? "" : fmt::format(" held by {}={}", h.axis, h.index); }

void check_held_by(const Shard& s, const HeldBy& h, const std::string& name, const char* op) {
  if (h.everywhere()) return;
  if (!s.mesh().has(h.axis)) fail(op, "tensor '{}' is held by mesh axis '{}', which mesh {} lacks", name, h.axis, s.mesh().str());
  if (h.index < 0 || h.index >= s.mesh().axis_size(h.axis))
    fail(op, "tensor '{}' is held by {}={}, outside the axis's 0 to {}", name, h.axis, h.index, s.mesh().axis_size(h.axis) - 1);
}

// The global value of `t` on the writer, for a tensor only the devices at held_by's coordinate
// hold: they gather their blocks over the other mesh axes, then pass the whole tensor along
// held_by.axis to the writer's coordinate (the others send zeros of its shape, which nobody keeps:
// one global tensor per device at a time, as Shard::gather holds).
Tensor gather_held(Shard& s, const ShardedTensor& t, int writer) {
  const std::string& axis = t.held_by.axis;
  Tensor whole;
  if (t.held_by.here(s)) {
    whole = stop_gradient(t.block);  // defined: save_sharded checked it
    for (const auto& e : whole.vary().entries())
      if (e.mesh_axis != axis && e.kind != Vary::Split)
        fail("save_sharded", "tensor '{}' is {}: a held tensor's block is cut or Invariant over every mesh axis but '{}'", t.name, whole.str(), axis);
    whole = all_gather_cuts(whole);
    if (whole.shape() != t.global)
      fail("save_sharded", "tensor '{}' gathers to {}, announced as {}", t.name, whole.shape().str(), t.global.str());
  } else {
    whole = s.full(t.global, {}, 0.0, t.dtype);
  }
  VaryType varying;
  varying.set_varying(axis);
  const int to = s.mesh().coord(writer, axis);
  const Tensor moved = t.held_by.index == to ? whole.with_vary(varying) : ppermute(whole.with_vary(varying), axis, {{t.held_by.index, to}});
  return moved.with_vary(VaryType{}).on_host();
}

}  // namespace

bool HeldBy::here(const Shard& s) const { return everywhere() || s.coord(axis) == index; }

void save_sharded(Shard& s, const std::string& path, const std::vector<ShardedTensor>& tensors, const Metadata& metadata, int writer) {
  if (writer < 0 || writer >= s.mesh().size())
    fail("save_sharded", "'{}': writer {} is not a device of mesh {} (devices 0 to {})", path, writer, s.mesh().str(), s.mesh().size() - 1);
  std::vector<std::string> entries{fmt::format("writer: device {}", writer)};
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = tensors[k];
    check_held_by(s, t.held_by, t.name, "save_sharded");
    if (t.held_by.here(s) && !t.block.defined())
      fail("save_sharded", "'{}': tensor '{}' has no block on device {}, which holds it{}", path, t.name, s.device(), held_text(t.held_by));
    if (!t.held_by.everywhere() && t.held_by.here(s) && t.block.dtype() != t.dtype)
      fail("save_sharded", "'{}': tensor '{}' is {} but announced as {}{}", path, t.name, t.block.str(), dtype_name(t.dtype), held_text(t.held_by));
    entries.push_back(detail::tensor_entry(k, t.name, dtype_name(dtype_of(t)), t.global, stored_dims(t)) + held_text(t.held_by));
  }
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
      TensorInfo info{t.name, dtype_of(t), dims};
      info.axes = t.global.axes();
      infos.push_back(std::move(info));
    }
    file = std::make_unique<SafetensorsWriter>(path, std::move(infos), metadata);
  }
  for (const auto& t : tensors) {
    // one global tensor alive at a time
    Tensor global = t.held_by.everywhere() ? s.gather(stop_gradient(t.block)) : gather_held(s, t, writer);
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
  return detail::load_blocks(s, file.path(), tensors, rules, [&](const ShardedRead& t) { return file.read(t.name, t.global); });
}

std::vector<Tensor> detail::load_blocks(Shard& s, std::string_view source, const std::vector<ShardedRead>& tensors, const AxisRules& rules,
                                        const std::function<Tensor(const ShardedRead&)>& read) {
  std::vector<std::string> entries;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    check_held_by(s, tensors[k].held_by, tensors[k].name, "load_sharded");
    entries.push_back(detail::tensor_entry(k, tensors[k].name, "", tensors[k].global, stored_dims(tensors[k])) + held_text(tensors[k].held_by));
  }
  detail::require_same_on_every_device(s, "load_sharded", fmt::format("tensors to load from '{}' (names in the same order, global "
                                       "shapes and stored dims)", source), entries);
  std::vector<Tensor> blocks;
  blocks.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t.held_by.here(s)) {
      blocks.emplace_back();
      continue;
    }
    Tensor block = s.shard(read(t), rules);  // the global copy dies here
    NoGrad no_grad;
    blocks.push_back(t.held_by.everywhere() ? std::move(block) : pvary(block, t.held_by.axis));
  }
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
