// The one way the CUDA backend's own kernels are launched (launch_kernel), and the two device
// calls of programmatic dependent launch (PDL, sm_90) every such kernel makes.
//
// A decode step is hundreds of small dependent kernels; without PDL each waits for the one
// before it to drain and then pays its own launch. Launched with PDL, kernel N+1 starts once
// every block of kernel N has called pdl_launch_dependents (or exited), and its pdl_wait
// blocks until kernel N has completed and its memory is visible. So the rule of every kernel
// launched here:
//   - pdl_wait() before its first global memory access, read or write (but see the weights
//     below), in every block and on every path (an early return included): the kernel before
//     it may still be running, and a block that left without waiting could let the grid
//     complete before its predecessor, breaking the chain the kernel after it relies on;
//   - pdl_launch_dependents() right after it: the next kernel then launches while this one
//     does its work. Calling it after the wait, not before, keeps at most one grid waiting
//     early on the GPU instead of a cascade of them holding SM slots.
// One exception: the model's weights (and other tensors fixed at load, like rope's inverse
// frequencies), which no kernel of a step writes, may be read before pdl_wait. Every model's
// load ends in a synchronize, so they are complete before the first step. A weight read after
// the wait is a cold miss on the step's critical path: about 3 us for a norm's weight on the
// H200 (docs/PERF.md); read before it, the miss overlaps the kernel before. Activations,
// positions, slots, ids and the cache are read only after the wait.
// Without the launch attribute (pdl false, or a kernel launched by <<<>>> or cuBLASLt) both
// are no-ops and ordinary stream order holds; kernels that never wait (the MoE files' today)
// must never be launched with it.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "ops/cuda/launch.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "launch.cuh: griddepcontrol needs sm_90 (the CUDA backend is built for sm_90a)"
#endif

namespace tetra::ops::cuda {

// Blocks until the grids this one depends on have completed and their writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next grid on the stream launch (once every block of this one has said so or
// exited); it still waits in its own pdl_wait for this grid to finish.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// kernel<<<grid, block, smem, l.stream>>>(args...), with PDL when l.pdl, and in clusters of
// `cluster_x` consecutive blocks along x when it is above 1. Each argument is converted to its
// parameter's type as a <<<>>> launch converts it; a failed launch throws (and clears the
// runtime's last error, as TETRA_CUDA_CHECK_LAUNCH does).
// Dynamic shared memory past 48 KB must be allowed per kernel and per device, and one process
// drives each of its GPUs from a thread of its own: the first launch of a kernel on a device
// allows it there. (Allowing once per process, as the kernels did, would have failed the first
// launch on a second GPU.) The call is legal while the thread captures a graph.
inline void allow_dynamic_smem(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;  // (kernel, device) -> bytes
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(mu);
  if (err == cudaSuccess) {
    const auto it = allowed.find({kernel, device});
    if (it != allowed.end() && it->second >= bytes) return;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA kernel launch failed: allowing ", bytes, " bytes of shared memory: ", cudaGetErrorString(err));
  }
  allowed[{kernel, device}] = bytes;
}

template <typename... Params, typename... Args>
void launch_kernel_in_clusters(const KernelLaunch& l, unsigned cluster_x, void (*kernel)(Params...), dim3 grid,
                               dim3 block, size_t smem, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch_kernel: one argument per kernel parameter");
  static_assert((std::is_convertible_v<Args&&, Params> && ...),
                "launch_kernel: an argument does not convert to its kernel parameter's type");
  cudaLaunchAttribute attrs[2]{};
  unsigned n_attrs = 0;
  if (l.pdl) {
    attrs[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n_attrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attrs[n_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[n_attrs++].val.clusterDim = {cluster_x, 1, 1};
  }
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = l.stream;
  config.attrs = n_attrs ? attrs : nullptr;
  config.numAttrs = n_attrs;
  // cudaLaunchKernelEx's template takes the kernel's parameter types and converts each
  // argument to its own (a copy of the right width is what the kernel reads).
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA kernel launch failed: ", cudaGetErrorString(err));
  }
}

template <typename... Params, typename... Args>
void launch_kernel(const KernelLaunch& l, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   Args&&... args) {
  launch_kernel_in_clusters(l, 1, kernel, grid, block, smem, std::forward<Args>(args)...);
}

}  // namespace tetra::ops::cuda
