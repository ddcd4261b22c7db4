#include "comm/mpi/mpi_types.h"

#include <climits>

#include "comm/mpi/mpi_session.h"
#include "kernels/cpu/kernels.h"
#include "nax/core/error.h"

namespace nax::mpi {

namespace {

template <ReduceOp op>
void bf16_reduce(void* in, void* inout, int* length, MPI_Datatype*) {
  cpu::accumulate(op, DType::bf16, inout, in, static_cast<std::size_t>(*length));
}

// The bf16 datatype and its three reductions, made on first use and freed before MPI_Finalize
// (this static is constructed after the Session's, so it is destroyed first).
class Bf16Types {
 public:
  Bf16Types() {
    check(MPI_Type_contiguous(2, MPI_BYTE, &type_), "MPI_Type_contiguous");
    check(MPI_Type_commit(&type_), "MPI_Type_commit");
    check(MPI_Op_create(&bf16_reduce<ReduceOp::sum>, 1, &ops_[0]), "MPI_Op_create");
    check(MPI_Op_create(&bf16_reduce<ReduceOp::max>, 1, &ops_[1]), "MPI_Op_create");
    check(MPI_Op_create(&bf16_reduce<ReduceOp::min>, 1, &ops_[2]), "MPI_Op_create");
  }
  ~Bf16Types() {
    if (!active()) return;
    for (MPI_Op& op : ops_) MPI_Op_free(&op);
    MPI_Type_free(&type_);
  }
  Bf16Types(const Bf16Types&) = delete;
  Bf16Types& operator=(const Bf16Types&) = delete;

  MPI_Datatype type() const { return type_; }
  MPI_Op op(ReduceOp op) const { return ops_[static_cast<int>(op)]; }

  static const Bf16Types& get() {
    Session::get();
    static Bf16Types types;
    return types;
  }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op ops_[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

}  // namespace

MPI_Datatype datatype(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::bf16: return Bf16Types::get().type();
  }
  fail("mpi", "no MPI datatype for dtype {}", static_cast<int>(dtype));
}

MPI_Op reduce_op(ReduceOp op, DType dtype) {
  if (dtype == DType::bf16) return Bf16Types::get().op(op);
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  fail("mpi", "no MPI op for reduction {}", static_cast<int>(op));
}

int count_of(std::size_t count, std::string_view op) {
  if (count > static_cast<std::size_t>(INT_MAX))
    fail(op, "{} elements exceed MPI's limit of {} per call", count, INT_MAX);
  return static_cast<int>(count);
}

}  // namespace nax::mpi
