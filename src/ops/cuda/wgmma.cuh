// The sm_90a warpgroup MMA (wgmma) building blocks the MoE GEMMs and MLA attention share:
// shared-memory matrix descriptors for 128-byte swizzled tiles, the async-group fences, and
// the BF16 m64nNk16 instructions with f32 accumulators.
//
// Tiles are stored as wgmma's canonical 128-byte swizzled layout: rows of 64 BF16 values (128
// bytes), 8 rows to a 1,024-byte atom, 16-byte unit c of row r at unit c ^ (r % 8). Every tile
// starts 1,024-byte aligned, so the swizzle phase comes from the address as the hardware
// reads it. Accumulator layout (m64nN, f32): warp w of the warpgroup holds rows 16w + g and
// 16w + g + 8 (g = lane / 4); d[4j + e] is row 16w + g, column 8j + 2 (lane % 4) + e, and
// d[4j + 2 + e] the same column of row 16w + g + 8.
#pragma once

#include <cstdint>

namespace tetra::ops::cuda::wgmma {

// K-major operand (A, or B with K contiguous): rows are M or N, 64 values of K each; 8-row
// groups 1,024 bytes apart (SBO). A k-step of 16 starts 32 bytes further into the rows.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// MN-major B (N contiguous: a row holds 64 values of N for one k): 8 k-rows to an atom, the
// next 8 k 1,024 bytes on (SBO), the next 64 values of N `n_atom_bytes` on (LBO).
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr, uint32_t n_atom_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((n_atom_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Unit c (16 bytes) of row r of a swizzled atom, in bytes from the atom.
__device__ __forceinline__ uint32_t swizzled(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() {  // kPending groups may stay in flight
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Generic-proxy writes of shared memory (st.shared, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Keeps the compiler from moving accesses to registers that an async wgmma owns.
template <int kN>
__device__ __forceinline__ void fence_acc(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define TETRA_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                      "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TETRA_ACC32(i) TETRA_ACC8(i), TETRA_ACC8(i + 8), TETRA_ACC8(i + 16), TETRA_ACC8(i + 24)
// Operand lists are spelled out: PTX wants every accumulator register by name.
#define TETRA_D32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TETRA_D64 TETRA_D32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TETRA_D96 TETRA_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define TETRA_D128 TETRA_D96 ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, " \
                   "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "  \
                   "%125, %126, %127"

// D[64 x N] += A[64 x 16] (registers) * B[16 x N] (shared, K-major); N = 2 x (accumulators).
__device__ __forceinline__ void mma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" TETRA_D32 "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;"
               : TETRA_ACC32(0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" TETRA_D64 "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 0;"
               : TETRA_ACC32(0), TETRA_ACC32(32)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// The same with B MN-major (N contiguous; desc_mn_major): attention's P V, V's rows being keys.
__device__ __forceinline__ void mma_rs_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" TETRA_D64 "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;"
               : TETRA_ACC32(0), TETRA_ACC32(32)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[96], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {" TETRA_D96 "}, {%96, %97, %98, %99}, %100, 1, 1, 1, 0;"
               : TETRA_ACC32(0), TETRA_ACC32(32), TETRA_ACC32(64)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" TETRA_D128 "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 0;"
               : TETRA_ACC32(0), TETRA_ACC32(32), TETRA_ACC32(64), TETRA_ACC32(96)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// D[64 x N] += A[64 x 16] (shared, K-major) * B[16 x N] (shared; K-major, or MN-major when
// kTransB).
template <int kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, %10;"
               : TETRA_ACC8(0)
               : "l"(a), "l"(b), "n"(kTransB));
}
template <int kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
               "%11, %12, %13, %14, %15}, %16, %17, 1, 1, 1, 0, %18;"
               : TETRA_ACC8(0), TETRA_ACC8(8)
               : "l"(a), "l"(b), "n"(kTransB));
}
template <int kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" TETRA_D32 "}, %32, %33, 1, 1, 1, 0, %34;"
               : TETRA_ACC32(0)
               : "l"(a), "l"(b), "n"(kTransB));
}
template <int kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" TETRA_D64 "}, %64, %65, 1, 1, 1, 0, %66;"
               : TETRA_ACC32(0), TETRA_ACC32(32)
               : "l"(a), "l"(b), "n"(kTransB));
}
template <int kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" TETRA_D128 "}, %128, %129, 1, 1, 1, 0, %130;"
               : TETRA_ACC32(0), TETRA_ACC32(32), TETRA_ACC32(64), TETRA_ACC32(96)
               : "l"(a), "l"(b), "n"(kTransB));
}

#undef TETRA_D128
#undef TETRA_D96
#undef TETRA_D64
#undef TETRA_D32
#undef TETRA_ACC32
#undef TETRA_ACC8

}  // namespace tetra::ops::cuda::wgmma
