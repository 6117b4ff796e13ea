// The sums a row norm takes, shared by the norm kernels (norm.cu) and the all-reduce that ends
// in a norm (peer_all_reduce.cu): both add in the same order, so they leave the same bits.
#pragma once

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

}  // namespace tetra::ops::cuda
