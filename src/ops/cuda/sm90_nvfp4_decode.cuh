// Device helpers shared by the MoE GEMM kernels: streaming loads and the register decode of
// NVFP4 (e2m1 codes in the device word order of nvfp4_word.h, E4M3 block scales) to BF16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/cuda/mma_sync.cuh"  // word
#include "ops/cuda/nvfp4_word.h"

namespace tetra::ops::cuda {

// Weights are read once per work item: don't let them push the activations out of L1. A
// warp's load is part of a contiguous stream (nvfp4_tile.h) that the next chunks continue, so
// ask L2 to fetch the surrounding 256 bytes from DRAM at once.
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ld_stream_u32(const void* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// The same reads into shared memory (cp.async: the bytes in flight hold no registers). Each
// thread's copies complete in the order of its commit groups (cp_async_commit and
// cp_async_wait, mma_sync.cuh).
__device__ __forceinline__ void cp_async_stream_16(void* smem_dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_stream_4(void* smem_dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst))),
               "l"(src)
               : "memory");
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two E4M3 block scales as bf16 pairs (each scale in both halves), times 2^118 so that the
// product with the 2^-126 of the raw decode (nvfp4_pair_raw) is scale * 2^-8 (the kernel
// multiplies 2^8 back into the global scale). 448 * 2^118 < 2^127, so the bf16 cannot
// overflow; the product of a 2-bit e2m1 significand and a 4-bit E4M3 one is exact in bf16.
__device__ __forceinline__ void scale_pair_to_bf16x2(uint32_t s, uint32_t& s0, uint32_t& s1) {
  __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s), __NV_E4M3);
  float2 f = __half22float2(*reinterpret_cast<__half2*>(&hr));
  __nv_bfloat162 b0 = __float2bfloat162_rn(f.x * 0x1p118f);
  __nv_bfloat162 b1 = __float2bfloat162_rn(f.y * 0x1p118f);
  s0 = *reinterpret_cast<uint32_t*>(&b0);
  s1 = *reinterpret_cast<uint32_t*>(&b1);
}

}  // namespace tetra::ops::cuda
