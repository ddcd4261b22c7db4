#pragma once
// Shared by the op implementations: tensor construction, device checks, layouts, vary rules.
#include <initializer_list>
#include <string>
#include <vector>

#include "nax/kernels/kernels.h"
#include "nax/ops.h"
#include "nax/runtime.h"
#include "nax/trace.h"

namespace nax::detail {

// The current shard's device, or the host outside Runtime::run.
const std::shared_ptr<Device>& current_device();

// Told of every tensor make_result makes on the calling thread while it is set: the op recorder
// (nax/debug/op_recorder.h), which learns the ops' extents from their trace spans (trace::SpanObserver).
class ResultObserver {
 public:
  virtual ~ResultObserver() = default;
  virtual void made(const Tensor& result) = 0;
  // The running op's result is filled after the op returns (a started collective): not readable yet.
  virtual void filled_later() = 0;
  // `sum` (an op's result) keeps `terms` for psum (deterministic mode: Tensor::partial_terms).
  virtual void terms_kept(const Tensor& sum, const std::vector<Tensor>& terms) = 0;
};
extern thread_local ResultObserver* t_result_observer;
// Sets the calling thread's observer (nullptr: none) and returns the previous one.
ResultObserver* set_result_observer(ResultObserver* observer);

// A fresh tensor for an op's result, on `device`.
Tensor make_result(const Shape& shape, DType dtype, VaryType vary, const std::shared_ptr<Device>& device);

// Throws naming `op` when the operands live on different devices or are undefined.
void check_operands(std::string_view op, std::initializer_list<const Tensor*> operands);
// check_operands, then the op's slice in the trace (nax/trace.h) until the returned span ends:
// every op enters through it, so an op holds it for its whole body.
[[nodiscard]] trace::Span enter_op(std::string_view op, std::initializer_list<const Tensor*> operands);
void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b);

// The result vary type of an op over `operands` (DESIGN.md §3): Varying wins; Split(a) and Split(a)
// agree; Split(a) meeting a whole `a` or two axes cut over one mesh axis is an error; a Split axis
// in `reduced` becomes Varying, for `reduced_reason` (a partial sum unless told). A Varying
// result keeps its Varying operands' reason when they agree, else is per_device.
VaryType merge_vary(std::string_view op, const std::vector<const Tensor*>& operands,
                    const std::vector<std::string>& reduced = {}, VaryReason reduced_reason = VaryReason::partial_sum);

// Strides of `x`'s axes in the order of `axes` (0 for axes x lacks): for broadcasting.
kernels::Dims strides_in_order(const Shape& x, const std::vector<Axis>& axes);
kernels::Dims sizes_of(const std::vector<Axis>& axes);

// Deterministic mode: the terms of a + b (of shape `shape`), {a, b} broadcast to it, when both are
// partial sums over a common mesh axis (a and b keep their own terms: psum rebuilds the tree of
// adds), else none.
std::vector<Tensor> partial_terms_of_sum(const Tensor& a, const Tensor& b, const Shape& shape);
[[noreturn]] void refuse_unfinished_terms(std::string_view op, const Tensor& x);
// Deterministic mode, for every operand of every op (enter_op): refuses, naming `op`, a partial sum
// over a mesh axis unless the op is exact on its parts (add, neg, concat, layout ops), and a sum of
// partial sums (terms) unless the op is add: anything else would reassociate the sum by the mesh.
void refuse_unfinished_sum(std::string_view op, const Tensor& x);

// Whether the shard running this thread computes in deterministic mode (RuntimeOptions::deterministic).
bool deterministic();
// Deterministic mode's tree for a sum over `axes` of x (the kernel walks them row-major, the first
// one major), off otherwise: the blocks of those axes cut over mesh axes fix the forced halvings
// (nax/core/sum_tree.h). Refuses, naming `op`, a cut axis that is not the first: a device's
// elements would not be one contiguous block of the walk.
SumTree sum_tree(std::string_view op, const Tensor& x, const std::vector<std::string>& axes);

// The kernels of the device `x` lives on.
inline kernels::Kernels& kernels_of(const Tensor& x) { return x.device().kernels(); }

// Whether x's device computes x's dtype only after widening it to f32 (bf16 on the CPU).
bool needs_widening(const Tensor& x);
// x as f32 when its device needs that (see needs_widening), else x itself; and back.
Tensor widen(const Tensor& x);
Tensor narrow_to(const Tensor& x, DType dtype);

// x's values on `device` (x itself when already there): host <-> device or via the host.
Tensor transfer(const Tensor& x, const std::shared_ptr<Device>& device);

// A hash of x's bytes (FNV-1a, read on the host), cut to 48 bits so that it is exact in an f64: for
// comparing a value across the devices of a group with one small collective.
double content_hash48(const Tensor& x);

// Copies x into the axis order `order` (a permutation of x's axes); x itself when already there.
Tensor permute_to(const Tensor& x, const std::vector<std::string>& order);

// The block at `offsets` (of shape `local`) of the global random tensor of shape `global`.
Tensor random_block(const Shape& global, const Shape& local, const std::vector<std::int64_t>& offsets,
                    std::uint64_t seed, std::string_view name, DType dtype, bool normal, double a, double b);

// g summed over the axes `shape` lacks (the gradient of a broadcast); g broadcast to `shape`.
Tensor sum_to(const Tensor& g, const Shape& shape);
Tensor broadcast_to(const Tensor& g, const Shape& shape);

std::string describe(const std::vector<const Tensor*>& operands);  // "f32[a=2] and f32[b=3]"

}  // namespace nax::detail
