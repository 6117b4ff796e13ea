// Shared-memory mbarriers (sm_90): the stage handshakes of warp-specialized kernels, where a
// producer warp fills a ring of shared-memory stages and consumer warps compute on them.
// A barrier completes a phase when its count of arrivals is reached; waiters name the parity
// of the phase they wait for (a fresh barrier is in phase 0), so a stage used for the k-th time
// is waited on with parity k & 1.
#pragma once

#include <cstdint>

namespace tetra::ops::cuda::mbarrier {

__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the inits visible to the other threads' barrier operations (with a block barrier after).
__device__ __forceinline__ void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Release: this thread's earlier writes are visible to threads that see the phase complete.
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Acquire: returns once the phase of this parity has completed.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace tetra::ops::cuda::mbarrier
