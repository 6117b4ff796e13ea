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

namespace tetra::ops::cuda {

// A copy on `stream`, complete on return. A plain cudaMemcpy runs on the legacy default
// stream, which a non-blocking stream does not wait for: a kernel on it could read the
// destination before the copy lands. Host buffers may be freed right after.
inline void copy_and_wait(cudaStream_t stream, void* dst, const void* src, size_t bytes,
                          cudaMemcpyKind kind) {
  TETRA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace tetra::ops::cuda
