#pragma once
// Reductions across a group of threads that work on one row or one output: a group is 1 thread,
// one warp (32), or the whole block (a multiple of 32; then blockDim.x must equal Group). The order
// of combination is fixed, so results are deterministic. Every thread of the group must call,
// and every thread gets the result.

namespace nax::cuda::detail {

template <typename T>
struct Pair {
  T first, second;
};

template <typename T>
__device__ __forceinline__ T shuffle_xor(T v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}
template <typename T>
__device__ __forceinline__ Pair<T> shuffle_xor(Pair<T> v, int offset) {
  return {__shfl_xor_sync(0xffffffffu, v.first, offset), __shfl_xor_sync(0xffffffffu, v.second, offset)};
}

template <int Group, typename T, typename Combine>
__device__ __forceinline__ T group_reduce(T v, Combine combine) {
  static_assert(Group == 1 || Group == 32 || (Group > 32 && Group % 32 == 0), "a group is a thread, a warp or warps");
  constexpr int kWarpWidth = Group < 32 ? Group : 32;
#pragma unroll
  for (int offset = kWarpWidth / 2; offset > 0; offset /= 2) v = combine(v, shuffle_xor(v, offset));
  if constexpr (Group > 32) {
    constexpr int kWarps = Group / 32;
    __shared__ T partial[kWarps];
    __syncthreads();  // the previous call's readers are done with `partial`
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = partial[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = combine(v, partial[w]);
  }
  return v;
}

template <int Group, typename T>
__device__ __forceinline__ T group_sum(T v) {
  return group_reduce<Group>(v, [](T a, T b) { return a + b; });
}

template <int Group, typename T>
__device__ __forceinline__ Pair<T> group_sum(Pair<T> v) {
  return group_reduce<Group>(v, [](Pair<T> a, Pair<T> b) { return Pair<T>{a.first + b.first, a.second + b.second}; });
}

template <int Group, typename T>
__device__ __forceinline__ T group_max(T v) {
  return group_reduce<Group>(v, [](T a, T b) { return a > b ? a : b; });
}

}  // namespace nax::cuda::detail
