#pragma once
// The CUDA rotary embedding (rotary.cu), in place, with the semantics of nax/kernels/kernels.h:
// `outer_offsets` (outer_count of them) are in device memory here.
#include <cuda_runtime.h>

#include <cstdint>

#include "nax/kernels/kernels.h"

namespace nax::cuda {

void rotary_in_place(cudaStream_t stream, const kernels::RotarySizes& sizes, void* data, const std::int64_t* outer_offsets,
                     std::int64_t outer_count);

}  // namespace nax::cuda
