#pragma once
// Deterministic mode (RuntimeOptions::deterministic, docs/determinism.md): every sum in one
// canonical order fixed by the global problem, so that results do not depend on the mesh. The
// ops, the collectives and autodiff reach the mode only through this header: which tree a sum
// walks, whether an operand may enter an op, the records of sums of partial sums and of local
// means, and the psums that finish them in the canonical order.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nax/comm/communicator.h"
#include "nax/core/names.h"
#include "nax/core/vary.h"
#include "nax/kernels/sum_tree.h"
#include "nax/tensor/tensor.h"
#include "comm/launch.h"

namespace nax::deterministic {

// Whether the shard running this thread computes in deterministic mode.
bool on();

// The tree of a sum over `axes` of x (the kernel walks them row-major, the first one major): the
// blocks of those axes cut over mesh axes fix the forced halvings; off outside deterministic mode.
// Refuses, naming `op`, a cut axis that is not the first: a device's elements would not be one
// contiguous block of the walk.
SumTree sum_tree(std::string_view op, const Tensor& x, const std::vector<std::string>& axes);

// Refuses, naming `op`, an operand the mode cannot make mesh-independent: a partial sum entering an
// op whose rule for it (nax/core/vary.h) neither adds nor moves its elements, and a sum of partial
// sums entering any op but add and sub (the terms would be lost).
void check_operand(std::string_view op, const Tensor& x, OnPartial rule);
// Refuses a bf16 partial sum (rounded to bf16 before its psum: the bits would depend on how many
// devices share the sum), naming `op` and its operands.
void check_partial_result(std::string_view op, const VaryType& result, DType dtype, std::string_view operands);

// The records the mode keeps beside tensors (never inside them), alive as long as the tensor:
// `sum` = a + b (or a - b) keeps a and b (or -b) as its terms when both are partial sums over a
// common mesh axis, so that psum can finish each and redo the adds in order.
void keep_terms_of_sum(const Tensor& sum, const Tensor& a, const Tensor& b, bool negate_b);
const std::vector<Tensor>& terms_of(const Tensor& x);
// A mean over tensor axes cut over the mesh keeps its local sum (typed a partial sum) and count,
// so that pmean divides the psum of the sums by the global count, as one device divides its sum.
struct LocalMean {
  Tensor sum;
  std::int64_t count = 0;
};
void keep_local_mean(const Tensor& mean, const Tensor& sum, std::int64_t count);
std::optional<LocalMean> local_mean_of(const Tensor& mean);

// The dtype a collective sums `dtype` in: bf16 in f32 on every backend (NCCL and MPI would add
// bf16 values in bf16), others as they are.
DType summed_dtype(DType dtype);

// psum over several mesh axes ranks the group in the mesh's order, whatever order the call names
// them in: blocks cut over several mesh axes are numbered major first in mesh order.
Names in_mesh_order(const Names& mesh_axes);

// The psum of x over the group of `comm` (n ranks; its calls made with `call`) in the canonical order, typed `vary`: each
// partial sum of x's record added over the ranks in the halving tree, then the adds that combined
// them redone in their order. One all_gather of all the terms: n times an all-reduce's data.
Tensor psum(Communicator& comm, const Call& call, const Tensor& x, const Names& mesh_axes, const VaryType& vary, detail::Launch& launch);
// The same, keeping this rank's block `out` of x viewed as [outer, ranks, block / outer].
Tensor psum_scatter(Communicator& comm, const Call& call, const Tensor& x, const Names& mesh_axes, Tensor out, std::int64_t outer,
                    detail::Launch& launch);

// Whether this reduction may be the communicator's own: it adds the ranks in the canonical order
// (Communicator::adds_in_rank_tree), unless a test asked for the gather path.
bool adds_in_rank_tree(const Communicator& comm, CollectiveKind kind, std::int64_t count, DType dtype);

// Tests: while one is alive (and `on`), psum and psum_scatter gather every rank's value even where
// the communicator adds the ranks in the halving tree itself, so that both paths meet the same
// references.
class GatherPsumsForTesting {
 public:
  explicit GatherPsumsForTesting(bool on = true);
  ~GatherPsumsForTesting();
  GatherPsumsForTesting(const GatherPsumsForTesting&) = delete;
  GatherPsumsForTesting& operator=(const GatherPsumsForTesting&) = delete;

 private:
  bool was_;
};

}  // namespace nax::deterministic
