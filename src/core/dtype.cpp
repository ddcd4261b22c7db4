#include "nax/core/dtype.h"

#include "nax/core/error.h"

namespace nax {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::i32})
    if (dtype_name(d) == name) return d;
  fail("parse_dtype", "unknown dtype '{}' (expected f32, f64, bf16 or i32)", name);
}

bool is_floating(DType dtype) { return dtype != DType::i32; }

}  // namespace nax
