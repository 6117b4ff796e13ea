#include "ops/cuda/norm.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/norm_row.cuh"

namespace tetra::ops::cuda {
namespace {

// Narrow rows (qk-norm heads, hidden states of tiny models): one warp per row; rows wider
// than norm_row_kernel holds: one block per row walking it (block_row). With `delta`, x += delta
// first (add_rms_norm): each thread stores the sums it owns and reads them back rounded, so
// the norm sees exactly what a separate add would have left.
template <bool kLayerNorm>
__global__ void norm_kernel(void* x, DType xdt, const void* delta, DType ddt, const void* w, DType wdt,
                            const void* b, DType bdt, float eps, void* out, DType odt, int64_t rows, int64_t d,
                            bool block_row) {
  pdl_wait();
  pdl_launch_dependents();
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

// Wide rows (hidden states, d >= 512): one block of kRowThreads per row, each thread holding
// its run of kPer values (norm_row.cuh's row_value) and their weights in registers (at most 8:
// wider rows take more threads), so a row costs one round of loads however few rows there are
// (one warp walking a 2,048-wide row alone waits on 64 dependent rounds: about 50 us at T = 1).
constexpr int kMaxRowThreads = 1024;

template <bool kLayerNorm, int kPer, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads) norm_row_kernel(void* x, DType xdt, const void* delta, DType ddt,
                                                               const void* w, DType wdt, const void* b, DType bdt,
                                                               float eps, void* out, DType odt, int64_t d) {
  // The weight (and bias) is the model's, which nothing in a step writes: it is loaded before
  // pdl_wait, while the kernel before this one finishes (launch.cuh), not after the reduction.
  const int64_t i0 = row_value<kPer>(threadIdx.x, 0);
  float wv[kPer], bv[kPer] = {};
  load_row_run<kPer>(w, i0, d, wdt, wv);
  if (kLayerNorm && b) load_row_run<kPer>(b, i0, d, bdt, bv);
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float partial[kRowThreads / 32];
  const int64_t base = int64_t(blockIdx.x) * d;
  float v[kPer];
  load_row_run<kPer>(x, base + i0, base + d, xdt, v);
  if (delta) {
    float dv[kPer];
    load_row_run<kPer>(delta, base + i0, base + d, ddt, dv);
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[j] = i0 + j < d ? round_to(xdt, v[j] + dv[j]) : 0.0f;  // what a separate add stores
    store_row_run<kPer>(x, base + i0, base + d, xdt, v);
  }
  float mean = 0.0f;
  if (kLayerNorm) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) s += v[j];  // zeros past d
    mean = block_sum<kRowThreads>(s, partial) / float(d);
  }
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (i0 + j < d) sq += (v[j] - mean) * (v[j] - mean);
  const float inv = rsqrtf(block_sum<kRowThreads>(sq, partial) / float(d) + eps);
  float y[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    y[j] = kLayerNorm ? (v[j] - mean) * inv * wv[j] : wv[j] * (v[j] * inv);
    if (kLayerNorm && b) y[j] += bv[j];
  }
  store_row_run<kPer>(out, base + i0, base + d, odt, y);
}

template <bool kLayerNorm, int kPer, int kRowThreads>
void launch_rows(const KernelLaunch& launch, TensorView x, TensorView delta, TensorView w, TensorView b, float eps,
                 TensorView out, int64_t rows, int64_t d) {
  launch_kernel(launch, norm_row_kernel<kLayerNorm, kPer, kRowThreads>, unsigned(rows), kRowThreads, 0, x.data,
                x.dtype, delta.data, delta.dtype, w.data, w.dtype, b.data, b.dtype, eps, out.data, out.dtype, d);
}

bool is_float(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

template <bool kLayerNorm>
void launch_norm(const KernelLaunch& launch, TensorView x, TensorView delta, TensorView w, TensorView b, float eps,
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
  TETRA_CHECK(rows <= INT32_MAX, "norm: ", rows, " rows is too many for one launch");
  if (d >= 512 && d <= 8 * kMaxRowThreads) {
    with_row_layout(d, [&]<int kPer, int kRowThreads>() {
      launch_rows<kLayerNorm, kPer, kRowThreads>(launch, x, delta, w, b, eps, out, rows, d);
    });
  } else if (d <= 2048) {
    constexpr int kWarps = 8;
    launch_kernel(launch, norm_kernel<kLayerNorm>, int((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, x.data, x.dtype,
                  delta.data, delta.dtype, w.data, w.dtype, b.data, b.dtype, eps, out.data, out.dtype, rows, d, false);
  } else {
    launch_kernel(launch, norm_kernel<kLayerNorm>, int(rows), 512, 0, x.data, x.dtype, delta.data, delta.dtype, w.data,
                  w.dtype, b.data, b.dtype, eps, out.data, out.dtype, rows, d, true);
  }
  TETRA_CUDA_CHECK_LAUNCH("norm");
}

}  // namespace

void rms_norm(const KernelLaunch& launch, TensorView x, TensorView weight, float eps, TensorView out) {
  launch_norm<false>(launch, x, {}, weight, {}, eps, out);
}

void add_rms_norm(const KernelLaunch& launch, TensorView h, TensorView delta, TensorView weight, float eps,
                  TensorView out) {
  launch_norm<false>(launch, h, delta, weight, {}, eps, out);
}

void layer_norm(const KernelLaunch& launch, TensorView x, TensorView weight, TensorView bias, float eps,
                TensorView out) {
  launch_norm<true>(launch, x, {}, weight, bias, eps, out);
}

}  // namespace tetra::ops::cuda
