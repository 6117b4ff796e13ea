#include "ops/cuda/norm.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"

namespace tetra::ops::cuda {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per row (rows of up to a few thousand values: qk-norm heads, hidden states of
// small models), or one block per row for wide rows (block_row). With `delta`, x += delta
// first (add_rms_norm): each thread stores the sums it owns and reads them back rounded, so
// the norm sees exactly what a separate add would have left.
template <bool kLayerNorm>
__global__ void norm_kernel(void* x, DType xdt, const void* delta, DType ddt, const void* w, DType wdt,
                            const void* b, DType bdt, float eps, void* out, DType odt, int64_t rows, int64_t d,
                            bool block_row) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = block_row ? blockIdx.x : blockIdx.x * (blockDim.x / 32) + warp;
  if (row >= rows) return;
  const int stride = block_row ? blockDim.x : 32, first = block_row ? threadIdx.x : lane;
  const int64_t base = row * d;
  auto reduce = [&](float v) {
    v = warp_sum(v);
    if (!block_row) return v;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    __syncthreads();  // partial is reused by the next reduction
    if (threadIdx.x == 0) partial[0] = s;
    __syncthreads();
    const float total = partial[0];
    __syncthreads();
    return total;
  };
  if (delta)
    for (int64_t i = first; i < d; i += stride)
      store_float(x, base + i, xdt, load_float(x, base + i, xdt) + load_float(delta, base + i, ddt));
  float mean = 0.0f;
  if (kLayerNorm) {
    float s = 0.0f;
    for (int64_t i = first; i < d; i += stride) s += load_float(x, base + i, xdt);
    mean = reduce(s) / float(d);
  }
  float sq = 0.0f;
  for (int64_t i = first; i < d; i += stride) {
    const float v = load_float(x, base + i, xdt) - mean;
    sq += v * v;
  }
  const float inv = rsqrtf(reduce(sq) / float(d) + eps);
  for (int64_t i = first; i < d; i += stride) {
    const float v = load_float(x, base + i, xdt);
    float y = kLayerNorm ? (v - mean) * inv * load_float(w, i, wdt) : load_float(w, i, wdt) * (v * inv);
    if (kLayerNorm && b) y += load_float(b, i, bdt);
    store_float(out, base + i, odt, y);
  }
}

bool is_float(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

template <bool kLayerNorm>
void launch(cudaStream_t stream, TensorView x, TensorView delta, TensorView w, TensorView b, float eps,
            TensorView out) {
  const int64_t d = x.dim(-1);
  TETRA_CHECK(d > 0 && w.numel() == d && (b.empty() || b.numel() == d), kLayerNorm ? "layer_norm" : "rms_norm",
              ": weight of ", w.numel(), " values for rows of ", d);
  TETRA_CHECK(out.numel() == x.numel() && is_float(x.dtype) && is_float(out.dtype) && is_float(w.dtype),
              kLayerNorm ? "layer_norm" : "rms_norm", ": float tensors of one size expected");
  TETRA_CHECK(delta.empty() || (delta.numel() == x.numel() && delta.dtype == x.dtype && out.data != x.data &&
                                 out.data != delta.data),
              "add_rms_norm: delta must match h in size and dtype, and out must be a third tensor");
  const int64_t rows = x.numel() / d;
  if (rows == 0) return;
  if (d <= 2048) {
    constexpr int kWarps = 8;
    norm_kernel<kLayerNorm><<<int((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(
        x.data, x.dtype, delta.data, delta.dtype, w.data, w.dtype, b.data, b.dtype, eps, out.data, out.dtype, rows,
        d, false);
  } else {
    norm_kernel<kLayerNorm><<<int(rows), 512, 0, stream>>>(x.data, x.dtype, delta.data, delta.dtype, w.data,
                                                          w.dtype, b.data, b.dtype, eps, out.data, out.dtype, rows,
                                                          d, true);
  }
  TETRA_CUDA_CHECK_LAUNCH("norm");
}

}  // namespace

void rms_norm(cudaStream_t stream, TensorView x, TensorView weight, float eps, TensorView out) {
  launch<false>(stream, x, {}, weight, {}, eps, out);
}

void add_rms_norm(cudaStream_t stream, TensorView h, TensorView delta, TensorView weight, float eps, TensorView out) {
  launch<false>(stream, h, delta, weight, {}, eps, out);
}

void layer_norm(cudaStream_t stream, TensorView x, TensorView weight, TensorView bias, float eps, TensorView out) {
  launch<true>(stream, x, {}, weight, bias, eps, out);
}

}  // namespace tetra::ops::cuda
