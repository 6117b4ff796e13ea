#include "ops/cuda/rope.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

__global__ void rope_kernel(void* x, DType dt, const int32_t* positions, const float* inv_freq, int64_t n_tokens,
                            int64_t n_heads, int64_t head_dim, int half, bool interleaved, float scaling) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = n_tokens * n_heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int p = int(i % half);
    const int64_t th = i / half, t = th / n_heads;
    const float angle = float(positions[t]) * inv_freq[p];
    const float c = cosf(angle) * scaling, s = sinf(angle) * scaling;
    const int64_t base = th * head_dim;
    const int64_t ia = base + (interleaved ? 2 * p : p), ib = base + (interleaved ? 2 * p + 1 : p + half);
    const float x1 = load_float(x, ia, dt), x2 = load_float(x, ib, dt);
    store_float(x, ia, dt, rotate_first(x1, x2, c, s));
    store_float(x, ib, dt, rotate_second(x1, x2, c, s));
  }
}

}  // namespace

void rope(const KernelLaunch& launch, TensorView x, TensorView positions, const RopeSpec& spec) {
  TETRA_CHECK(x.shape.rank == 3, "rope: x must be [T, heads, head_dim], not ", x.shape.str());
  const int64_t n_tokens = x.dim(0), n_heads = x.dim(1), head_dim = x.dim(2);
  TETRA_CHECK(spec.rotary_dim <= head_dim && spec.rotary_dim % 2 == 0, "rope: rotary_dim ", spec.rotary_dim,
              " does not fit a head of ", head_dim);
  TETRA_CHECK(positions.numel() == n_tokens && positions.dtype == DType::I32, "rope: one I32 position per token");
  TETRA_CHECK(spec.inv_freq.dtype == DType::F32 && spec.inv_freq.numel() * 2 >= spec.rotary_dim &&
                  spec.inv_freq.device == Device::Cuda,
              "rope: inv_freq must be F32 [rotary_dim / 2] on the device");
  const int half = spec.rotary_dim / 2;
  const int64_t total = n_tokens * n_heads * half;
  if (total == 0) return;
  const int blocks = int(std::min<int64_t>((total + 255) / 256, 65535 * 8));
  launch_kernel(launch, rope_kernel, blocks, 256, 0, x.data, x.dtype, positions.as<const int32_t>(),
                spec.inv_freq.as<const float>(), n_tokens, n_heads, head_dim, half, spec.interleaved,
                spec.attention_scaling);
  TETRA_CUDA_CHECK_LAUNCH("rope");
}

}  // namespace tetra::ops::cuda
