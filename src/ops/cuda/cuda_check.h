// Error checks for CUDA runtime calls and kernel launches: every failure becomes a
// tetra::Error naming the call, so the CLI prints one sentence instead of crashing.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define TETRA_CUDA_CHECK(expr)                                                        \
  do {                                                                                \
    cudaError_t tetra_cuda_err_ = (expr);                                             \
    if (tetra_cuda_err_ != cudaSuccess)                                               \
      ::tetra::fail("CUDA call failed: ", #expr, ": ", cudaGetErrorString(tetra_cuda_err_)); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, asynchronous faults at
// the next synchronizing call.
#define TETRA_CUDA_CHECK_LAUNCH(name) TETRA_CUDA_CHECK(cudaGetLastError())
