#pragma once
// nax element types and reductions as MPI datatypes and ops. bf16 has no MPI type: it travels as
// a 2-byte type of ours, reduced by ops of ours that compute in f32 and round once per pair of
// operands, exactly as the local backend does.
#include <mpi.h>

#include <cstddef>
#include <string_view>

#include "nax/comm/communicator.h"

namespace nax::mpi {

MPI_Datatype datatype(DType dtype);
MPI_Op reduce_op(ReduceOp op, DType dtype);

// `count` as MPI's int, or an error naming `op` when it does not fit.
int count_of(std::size_t count, std::string_view op);

}  // namespace nax::mpi
