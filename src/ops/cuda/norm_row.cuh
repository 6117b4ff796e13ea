// The sums a row norm takes, shared by the norm kernels (norm.cu) and the all-reduce that ends
// in a norm (peer_all_reduce.cu): both add in the same order, so they leave the same bits.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/device_values.cuh"

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

// A thread's run of kPer values at elements i .. i + kPer - 1 of p, those at or past `end` read
// as zeros and never written. A whole BF16 run on its alignment is one 8- or 16-byte access.
template <int kPer>
__device__ __forceinline__ bool whole_bf16_run(const void* p, int64_t i, int64_t end, DType dt) {
  return dt == DType::BF16 && i + kPer <= end &&
         reinterpret_cast<uintptr_t>(static_cast<const uint16_t*>(p) + i) % (2 * kPer) == 0;
}

template <int kPer>
__device__ __forceinline__ void load_row_run(const void* p, int64_t i, int64_t end, DType dt, float (&v)[kPer]) {
  static_assert(kPer == 4 || kPer == 8, "runs of 8 or 16 bytes");
  if (whole_bf16_run<kPer>(p, i, end, dt)) {
    uint32_t words[kPer / 2];
    const uint16_t* src = static_cast<const uint16_t*>(p) + i;
    if constexpr (kPer == 8) {
      const uint4 q = *reinterpret_cast<const uint4*>(src);
      words[0] = q.x, words[1] = q.y, words[2] = q.z, words[3] = q.w;
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(src);
      words[0] = q.x, words[1] = q.y;
    }
#pragma unroll
    for (int k = 0; k < kPer / 2; ++k) v[2 * k] = __uint_as_float(words[k] << 16), v[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    return;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = i + j < end ? load_float(p, i + j, dt) : 0.0f;
}

template <int kPer>
__device__ __forceinline__ void store_row_run(void* p, int64_t i, int64_t end, DType dt, const float (&v)[kPer]) {
  if (whole_bf16_run<kPer>(p, i, end, dt)) {
    uint32_t words[kPer / 2];
#pragma unroll
    for (int k = 0; k < kPer / 2; ++k) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);  // store_float's rounding
      words[k] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    uint16_t* dst = static_cast<uint16_t*>(p) + i;
    if constexpr (kPer == 8) *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
    else *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (i + j < end) store_float(p, i + j, dt, v[j]);
}

template <typename Launch>
void with_row_layout(int64_t d, Launch&& launch) {
  if (d <= 4 * 256) launch.template operator()<4, 256>();
  else if (d <= 8 * 256) launch.template operator()<8, 256>();
  else if (d <= 8 * 512) launch.template operator()<8, 512>();
  else launch.template operator()<8, 1024>();
}

}  // namespace tetra::ops::cuda
