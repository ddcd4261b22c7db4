#pragma once
// Shared by the op implementations: tensor construction, device checks, layouts, vary rules.
#include <initializer_list>
#include <optional>
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

// What an op does with a partial value (Vary::Partial: one term of a sum over a mesh axis) in one
// of its operands, declared by each op where it enters (enter_op). The vary rules and deterministic
// mode both read it; docs/ops.md "Partial sums" lists each op's.
enum class OnPartial {
  refuse,      // nonlinear in it (exp, a divisor, a condition, indices): psum (or pmean) first
  scale,       // linear in it, the other operands fixed (mul, dot, sum, rotary): at most one partial factor
  add,         // its elements are added to the other operands' (add, sub): all alike partial, or none
  accumulate,  // as add, several of its elements into one (scatter_add)
  move,        // its elements are moved, negated or selected (layout ops, neg, concat, where's branches)
};

// An op's operand and its OnPartial (refuse unless the op says otherwise).
struct Operand {
  Operand(const Tensor* t, OnPartial rule = OnPartial::refuse) : tensor(t), on_partial(rule) {}
  const Tensor* tensor;
  OnPartial on_partial;
};

// Throws naming `op` when the operands live on different devices or are undefined.
void check_operands(std::string_view op, std::initializer_list<const Tensor*> operands);
void check_operands(std::string_view op, const std::vector<const Tensor*>& operands);
// check_operands, the partial-value rules of the operands' OnPartial, then the op's slice in the
// trace (nax/trace.h) until the returned span ends: every op enters through it, so an op holds it
// for its whole body.
[[nodiscard]] trace::Span enter_op(std::string_view op, std::initializer_list<Operand> operands);
[[nodiscard]] trace::Span enter_op(std::string_view op, const std::vector<Operand>& operands);
void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b);

// The result vary type of an op over `operands` (docs/ops.md), once enter_op has checked their
// partial values: over each mesh axis a Partial operand makes the result Partial (a Split operand
// beside it is an error); a Split axis in `reduced` makes it Partial of `reduced_to` (a sum unless
// told; Varying when `reduced_to` is empty: max, min), even beside Varying operands; a Varying
// operand with the axis `a` cut keeps the result Split(a), one without it makes it Varying;
// Split(a) and Split(a) agree. Split(a) meeting a whole `a`, or two axes cut over one mesh axis,
// is an error.
VaryType merge_vary(std::string_view op, const std::vector<const Tensor*>& operands, const std::vector<std::string>& reduced = {},
                    std::optional<PartialKind> reduced_to = PartialKind::sum);

// Strides of `x`'s axes in the order of `axes` (0 for axes x lacks): for broadcasting.
kernels::Dims strides_in_order(const Shape& x, const std::vector<Axis>& axes);
kernels::Dims sizes_of(const std::vector<Axis>& axes);

// Deterministic mode: the terms of a + b (or of a - b, as a + -b: `negate_b`) of shape `shape`,
// broadcast to it, when both are partial sums over a common mesh axis (a and b keep their own
// terms: psum rebuilds the tree of adds), else none.
std::vector<Tensor> partial_terms_of_sum(const Tensor& a, const Tensor& b, const Shape& shape, bool negate_b = false);

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

// A hash of x's bytes (read on the host; four independent multiply-xorshift lanes over 8-byte
// words, so that it runs near memory speed): equal bytes give equal hashes, on any device.
std::uint64_t content_hash64(const Tensor& x);
// content_hash64 cut to 48 bits so that it is exact in an f64: for comparing a value across the
// devices of a group with one small collective.
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
