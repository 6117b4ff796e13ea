#include "ops/cuda/rank_sum.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kThreads = 256;

struct Sources {
  const void* p[kMaxRankSumSources];
};

template <typename T>
__global__ void sum_in_rank_order_kernel(Sources s, int n_sources, int64_t n, T* dst) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < n_sources; ++r) acc += to_float(static_cast<const T*>(s.p[r])[i]);
    dst[i] = from_float<T>(acc);
  }
}

}  // namespace

void launch_sum_in_rank_order(cudaStream_t stream, const void* const* sources, int n_sources, DType dtype,
                              int64_t n_elements, void* dst) {
  TETRA_CHECK(n_sources >= 1 && n_sources <= kMaxRankSumSources, "sum_in_rank_order: ", n_sources,
              " sources, where one launch adds 1 to ", kMaxRankSumSources);
  TETRA_CHECK(dtype == DType::F32 || dtype == DType::BF16, "sum_in_rank_order: ", dtype_name(dtype),
              " tensors are not summed (F32 or BF16)");
  TETRA_CHECK(n_elements >= 0, "sum_in_rank_order: a negative element count");
  if (n_elements == 0) return;
  Sources s{};
  for (int r = 0; r < n_sources; ++r) {
    TETRA_CHECK(sources[r] != nullptr, "sum_in_rank_order: source ", r, " is null");
    s.p[r] = sources[r];
  }
  TETRA_CHECK(dst != nullptr, "sum_in_rank_order: the destination is null");
  const KernelLaunch launch{.stream = stream};
  const int blocks = int(std::min<int64_t>(ceil_div(n_elements, kThreads), 65535 * 8));
  if (dtype == DType::F32)
    launch_kernel(launch, sum_in_rank_order_kernel<float>, blocks, kThreads, 0, s, n_sources, n_elements,
                  static_cast<float*>(dst));
  else
    launch_kernel(launch, sum_in_rank_order_kernel<__nv_bfloat16>, blocks, kThreads, 0, s, n_sources, n_elements,
                  static_cast<__nv_bfloat16*>(dst));
  TETRA_CUDA_CHECK_LAUNCH("sum_in_rank_order");
}

}  // namespace tetra::ops::cuda
