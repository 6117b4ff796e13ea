// How the CUDA backend's launchers enqueue a kernel: the stream, and whether the kernel may
// start while the one before it on the stream still runs (programmatic dependent launch,
// PDL; Hopper). Host-only, so plain C++ callers (the backend, tests) can build one; the
// device side and the launcher itself are in launch.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops.h"

namespace tetra::ops::cuda {

struct KernelLaunch {
  cudaStream_t stream = nullptr;
  // With PDL a kernel is launched as soon as its predecessor's blocks have all signalled (or
  // exited), and waits inside itself (pdl_wait) for the predecessor's completion and memory.
  bool pdl = false;
};

// A launcher's arithmetic: blocks to cover `a` items `b` at a time, and whether a pointer
// takes 16-byte vector accesses.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The launch an op gets from its context: ctx's stream, PDL where the backend turned it on.
inline KernelLaunch kernel_launch(const Context& ctx) {
  return {static_cast<cudaStream_t>(ctx.stream), ctx.pdl};
}

}  // namespace tetra::ops::cuda
