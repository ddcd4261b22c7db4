#pragma once
// Addresses inside a communicator's flat buffers: `elements` elements of `dtype` past `base`.
#include <cstddef>

#include "nax/core/dtype.h"

namespace nax::comm {

inline const char* element_at(const void* base, std::size_t elements, DType dtype) {
  return static_cast<const char*>(base) + elements * dtype_size(dtype);
}
inline char* element_at(void* base, std::size_t elements, DType dtype) { return static_cast<char*>(base) + elements * dtype_size(dtype); }

}  // namespace nax::comm
