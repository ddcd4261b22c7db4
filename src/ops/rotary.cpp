// rotary: GPT-J's rotary position embedding (interleaved pairs) on the first rotary_dims of
// head_dim, in any axis order. Its backward is the inverse rotation, the same kernel with the
// angle negated.
#include <cmath>

#include "ops/tape.h"
#include "ops/internal.h"

namespace nax {

namespace {

constexpr std::string_view kOp = "rotary";

struct RotaryArgs {
  std::string seq, head_dim;
  std::int64_t rotary_dims = 0, position_offset = 0;
  double base = 10000.0;
};

void check_rotary(const Tensor& x, const RotaryArgs& a) {
  if (!is_floating(x.dtype())) fail(kOp, "needs a floating dtype (f32, f64, bf16): {}", x.str());
  if (a.seq == a.head_dim) fail(kOp, "seq and head_dim are the same axis '{}': {}", a.seq, x.str());
  x.shape().require(a.seq, kOp);
  const std::int64_t head_dim_size = x.shape()[x.shape().require(a.head_dim, kOp)].size;
  if (a.rotary_dims < 0 || a.rotary_dims % 2 != 0 || a.rotary_dims > head_dim_size)
    fail(kOp, "rotary_dims {} must be even and between 0 and the size {} of axis '{}': {}", a.rotary_dims, head_dim_size, a.head_dim,
         x.str());
  if (!(a.base > 0) || !std::isfinite(a.base)) fail(kOp, "base {} must be a positive number: {}", a.base, x.str());
  for (const auto* axis : {&a.seq, &a.head_dim}) {
    const auto mesh_axes = x.vary().split_mesh_axes(*axis);
    if (!mesh_axes.empty())
      fail(kOp, "axis '{}' is cut over mesh axis '{}': {}; positions and pairs need the whole axis (all_gather it first)", *axis,
           mesh_axes.front(), x.str());
  }
}

// x rotated by `direction` times its angles (-1: the inverse rotation), in x's layout and dtype.
Tensor rotate(const Tensor& x_in, const RotaryArgs& a, double direction) {
  const Tensor x = detail::widen(stop_gradient(x_in));
  Tensor out = detail::make_result(x.shape(), x.dtype(), x.vary(), x.device_ptr());
  detail::kernels_of(out).copy_bytes(out.raw_mutable(), x.raw(), x.nbytes());
  std::vector<Axis> outer;
  for (const auto& axis : x.shape().axes())
    if (axis.name != a.seq && axis.name != a.head_dim) outer.push_back(axis);
  const auto strides = x.shape().strides();
  kernels::RotarySizes s;
  s.dtype = x.dtype();
  s.seq_len = x.size(a.seq);
  s.seq_stride = strides[static_cast<std::size_t>(x.shape().index_of(a.seq))];
  s.head_dim_stride = strides[static_cast<std::size_t>(x.shape().index_of(a.head_dim))];
  s.rotary_dims = a.rotary_dims;
  s.position_offset = a.position_offset;
  s.base = a.base;
  s.direction = direction;
  const kernels::Dims outer_sizes = detail::sizes_of(outer), outer_strides = detail::strides_in_order(x.shape(), outer);
  const auto offsets = kernels::strided_offsets(outer_sizes.data(), outer_strides.data(), static_cast<int>(outer.size()));
  if (x.numel() > 0) detail::kernels_of(out).rotary_in_place(s, out.raw_mutable(), offsets.data(), static_cast<std::int64_t>(offsets.size()));
  return detail::narrow_to(out, x_in.dtype());
}

}  // namespace

Tensor rotary(const Tensor& x, const std::string& seq, const std::string& head_dim, std::int64_t rotary_dims, std::int64_t position_offset,
              double base) {
  const RotaryArgs args{seq, head_dim, rotary_dims, position_offset, base};
  const auto op_span = detail::enter_op(kOp, {{&x, OnPartial::scale}});
  check_rotary(x, args);
  Tensor out = rotate(x, args, 1.0);
  if (!autodiff::any_requires_grad({&x})) return out;
  return autodiff::record(std::string(kOp), out, {x}, [args](const Tensor& g) { return std::vector<Tensor>{rotate(g, args, -1.0)}; });
}

}  // namespace nax
