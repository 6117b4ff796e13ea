// What the CUDA backend and the kernel benchmarks read of a device, in ops::DeviceProps.
#pragma once

#include <cuda_runtime.h>

#include "ops/cuda/cuda_check.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

inline DeviceProps device_props(int device) {
  cudaDeviceProp p{};
  TETRA_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return DeviceProps{p.name, p.multiProcessorCount, p.l2CacheSize, int64_t(p.sharedMemPerBlockOptin), p.major,
                     p.minor};
}

}  // namespace tetra::ops::cuda
