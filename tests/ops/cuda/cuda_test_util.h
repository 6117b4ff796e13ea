// What the CUDA kernel tests share: a CUDA call that must succeed, whether a device answers,
// and a device buffer that frees itself.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>

#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

namespace tetra::ops::cuda::testing_util {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

}  // namespace tetra::ops::cuda::testing_util
