// ZeRO-1's flat layout of the optimizer state (zero_layout.h).
#include "nn/zero_layout.h"

#include <algorithm>
#include <utility>

#include "nax/ops/collectives.h"
#include "nax/core/error.h"
#include "nax/kernels/kernels.h"
#include "nax/ops/ops.h"
#include "nax/runtime/runtime.h"

namespace nax::nn::detail {

namespace {

char* bytes_of(Tensor& t) { return static_cast<char*>(t.raw_mutable()); }
const char* bytes_of(const Tensor& t) { return static_cast<const char*>(t.raw()); }

}  // namespace

ZeroLayout::ZeroLayout(const std::vector<Tensor>& like, std::string axis) : axis_(std::move(axis)) {
  if (like.empty()) fail("AdamW", "no parameters to cut over mesh axis '{}'", axis_);
  const Shard* shard = Shard::current();
  if (shard == nullptr) fail("AdamW", "the optimizer state is cut over mesh axis '{}': step inside Runtime::run", axis_);
  if (!shard->mesh().has(axis_))
    fail("AdamW", "shard_state_over names mesh axis '{}', which mesh {} does not have: name one of its axes (the data-parallel "
         "one), or leave it empty to keep every moment on every device", axis_, shard->mesh().str());
  ranks_ = shard->mesh().axis_size(axis_);
  const int rank = shard->coord(axis_);
  dtype_ = like[0].dtype();
  device_ = like[0].device_ptr();
  for (std::size_t i = 0; i < like.size(); ++i) {
    const Tensor& t = like[i];
    if (t.dtype() != dtype_)
      fail("AdamW", "the state cut over '{}' needs parameters of one dtype: {} and {}", axis_, like[0].str(), t.str());
    if (t.vary().kind(axis_) != Vary::Invariant)
      fail("AdamW", "parameter {} is not Invariant over '{}': the state cut over '{}' is for replicated (data-parallel) parameters",
           t.str(), axis_, axis_);
    shapes_.push_back(t.shape());
    varies_.push_back(t.vary());
    parts_.push_back((t.numel() + ranks_ - 1) / ranks_);
    const std::int64_t start = parts_.back() * rank, length = std::min(parts_.back(), t.numel() - start);
    segment_of_.push_back(length > 0 ? static_cast<std::ptrdiff_t>(segments_.size()) : -1);
    if (length > 0) segments_.push_back({i, start, length});
  }
}

void ZeroLayout::check_matches(const std::vector<Tensor>& values, const char* op) const {
  if (values.size() != shapes_.size()) fail(op, "state for {} parameters, got {}", shapes_.size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i].shape() != shapes_[i] || values[i].dtype() != dtype_)
      fail(op, "value {} is {}, the state was laid out for {}{}", i, values[i].str(), dtype_name(dtype_), shapes_[i].str());
}

Tensor ZeroLayout::cut(const Tensor& value_in, const Segment& segment) const {
  const Shape& shape = shapes_[segment.param];
  Tensor value = value_in.shape().names() == shape.names() ? value_in : transpose(value_in, shape.names());
  if (value.dtype() != dtype_) value = cast(value, dtype_);
  const std::size_t es = dtype_size(dtype_);
  Tensor out = Tensor::empty(Shape{{"zero", segment.length}}, dtype_, device_);
  out.device().kernels().copy_bytes(bytes_of(out), bytes_of(std::as_const(value)) + static_cast<std::size_t>(segment.start) * es,
                                    static_cast<std::size_t>(segment.length) * es);
  return out;
}

std::vector<Tensor> ZeroLayout::gather(const std::vector<Tensor>& segment_values) const {
  if (segment_values.size() != segments_.size()) fail("AdamW", "{} segments, the layout has {}", segment_values.size(), segments_.size());
  VaryType varying;
  varying.set_varying(axis_);
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    Tensor part = Tensor::empty(Shape{{"zero", parts_[i]}}, dtype_, device_);  // padding past the parameter's end is never read
    if (segment_of_[i] >= 0) {
      const Tensor& own = segment_values[static_cast<std::size_t>(segment_of_[i])];
      part.device().kernels().copy_bytes(bytes_of(part), bytes_of(own), own.nbytes());
    }
    const Tensor whole = ranks_ > 1 ? all_gather_invariant(part.with_vary(varying), axis_, "zero") : part;
    Tensor t = Tensor::empty(shapes_[i], dtype_, device_);
    t.device().kernels().copy_bytes(bytes_of(t), bytes_of(whole), t.nbytes());
    out.push_back(t.with_vary(varies_[i]));
  }
  return out;
}

}  // namespace nax::nn::detail
