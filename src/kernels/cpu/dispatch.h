#pragma once
// Runs `body` with T bound to the C++ type of a dtype (f32, f64, i32).
#include "nax/core/dtype.h"
#include "nax/core/error.h"

#define NAX_DISPATCH_NUMERIC(dtype, op_name, T, ...)                                 \
  switch (dtype) {                                                                 \
    case ::nax::DType::f32: { using T = float; __VA_ARGS__; break; }               \
    case ::nax::DType::f64: { using T = double; __VA_ARGS__; break; }              \
    case ::nax::DType::i32: { using T = std::int32_t; __VA_ARGS__; break; }        \
    default: ::nax::fail(op_name, "unsupported dtype {}", ::nax::dtype_name(dtype)); \
  }
