// The acquire and release operations through which the blocks of a persistent kernel hand work
// to each other (gpu scope), and the ranks' kernels of a collective meet (system scope: the flag
// may sit in another GPU's memory) (sm_70+ memory model): a writer's stores, then a release of
// a counter or flag; a reader's acquire-load of it, then its loads (through L2: L1 is not
// coherent).
#pragma once

#include <cstdint>

namespace tetra::ops::cuda {

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Adds to a gpu-scope counter after this thread's earlier writes (and those ordered before
// them, as by a warp or block barrier) are visible: the release half of a hand-off.
__device__ __forceinline__ void red_add_release_gpu(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Returns the old value; orders earlier writes before it and later reads after it.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

}  // namespace tetra::ops::cuda
