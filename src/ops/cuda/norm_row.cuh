// The sums a row norm takes, shared by the norm kernels (norm.cu) and the all-reduce that ends
// in a norm (peer_all_reduce.cu): both add in the same order, so they leave the same bits.
#pragma once

#include <cstdint>

namespace tetra::ops::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of s over a block of kRowThreads, every thread getting it: each warp's sum, then the
// warps' in order. `partial` holds kRowThreads / 32 floats of shared memory, free again on return.
template <int kRowThreads>
__device__ __forceinline__ float block_sum(float s, float* partial) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  s = warp_sum(s);
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kRowThreads / 32; ++k) total += partial[k];
  __syncthreads();  // partial is reused by the next sum
  return total;
}

// The thread layout of a wide row of d values (512 to 8,192, norm.cu's norm_row_kernel): calls
// launch.template operator()<kPer, kRowThreads>() with kPer values a thread over kRowThreads
// threads, at most 8 a thread. The kernels that must add a row's squares in one order (the norm,
// the collective that ends in it) take their layout here, and their values' places from
// row_value.
// Value j of thread t's kPer: kPer consecutive values a thread (a BF16 run of 8 is one 16-byte
// access), the threads' runs in order; the last threads of a row narrower than
// kPer x kRowThreads hold none.
template <int kPer>
__device__ __forceinline__ int64_t row_value(int t, int j) {
  return int64_t(t) * kPer + j;
}

template <typename Launch>
void with_row_layout(int64_t d, Launch&& launch) {
  if (d <= 4 * 256) launch.template operator()<4, 256>();
  else if (d <= 8 * 256) launch.template operator()<8, 256>();
  else if (d <= 8 * 512) launch.template operator()<8, 512>();
  else launch.template operator()<8, 1024>();
}

}  // namespace tetra::ops::cuda
