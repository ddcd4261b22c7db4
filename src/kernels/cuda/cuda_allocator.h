#pragma once
// Device memory for one GPU, cached like the host allocator (nax/core/allocator.h): freed blocks
// go to size-class free lists and serve the next request of their class; empty_cache() hands them
// back with cudaFree. Blocks are 256-byte aligned (cudaMalloc's guarantee).
#include <memory>

#include "nax/core/allocator.h"

namespace nax::cuda {

std::shared_ptr<Allocator> make_caching_device_allocator(int device);

// The size class a request of `bytes` is served from (the same classes as the host allocator).
std::size_t device_size_class(std::size_t bytes);

// Called with the GPU before each cudaFree, which synchronises the device and would wait forever
// on NCCL kernels whose peers are stuck: the NCCL communicator installs one that waits (with its
// timeout) for the collectives in flight on that GPU.
void set_before_device_free(void (*hook)(int gpu));

}  // namespace nax::cuda
