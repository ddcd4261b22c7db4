#pragma once
// Runs a generic lambda with a value of the C++ floating type of `dtype` (f32 or f64), for
// kernels that compute only in floating point (the op layer widens bf16 to f32 first).
#include <string_view>

#include "nax/core/dtype.h"
#include "nax/core/error.h"

namespace nax::cpu {

template <typename Body>
void with_floating_type(DType dtype, std::string_view kernel, Body&& body) {
  switch (dtype) {
    case DType::f32: body(float{}); return;
    case DType::f64: body(double{}); return;
    default: fail(kernel, "kernel computes in f32 or f64, got {}", dtype_name(dtype));
  }
}

}  // namespace nax::cpu
