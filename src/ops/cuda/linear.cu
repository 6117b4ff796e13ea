#include "ops/cuda/linear.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

struct DeviceLinear {
  const void* w;
  DType wdt;
  WeightFormat format;
  const uint8_t* scale;  // NVFP4 block scales
  float global_scale;
  int64_t n_out, n_in;
  const void* bias;      // null: none
  DType bdt;
};

// W[n, k] as the CPU reference decodes it: NVFP4 as e2m1 * (f32(scale) * weight_scale_2).
__device__ __forceinline__ float weight_at(const DeviceLinear& L, int64_t n, int64_t k) {
  switch (L.format) {
    case WeightFormat::Nvfp4: {
      const uint8_t byte = static_cast<const uint8_t*>(L.w)[n * (L.n_in / 2) + k / 2];
      const float s = e4m3_to_float(L.scale[n * (L.n_in / 16) + k / 16]) * L.global_scale;
      return e2m1_to_float((k & 1) ? byte >> 4 : byte & 0xf) * s;
    }
    case WeightFormat::Fp8:
      return e4m3_to_float(static_cast<const uint8_t*>(L.w)[n * L.n_in + k]) * L.global_scale;
    default:
      return load_float(L.w, n * L.n_in + k, L.wdt);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Few tokens: one warp per output row streams the row once per group of kGroup tokens.
constexpr int kGroup = 8;

__global__ void linear_rows_kernel(DeviceLinear L, const void* x, DType xdt, int64_t n_tokens, void* out,
                                   DType odt) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (n >= L.n_out) return;
  const float b = L.bias ? load_float(L.bias, n, L.bdt) : 0.0f;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kGroup) {
    const int g = n_tokens - t0 < kGroup ? int(n_tokens - t0) : kGroup;
    float acc[kGroup] = {};
    for (int64_t k = lane; k < L.n_in; k += 32) {
      const float w = weight_at(L, n, k);
#pragma unroll
      for (int j = 0; j < kGroup; ++j)
        if (j < g) acc[j] += w * load_float(x, (t0 + j) * L.n_in + k, xdt);
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const float s = warp_sum(acc[j]);
      if (lane == 0 && j < g) store_float(out, (t0 + j) * L.n_out + n, odt, s + b);
    }
  }
}

// Many tokens: 64 x 64 output tiles through shared memory, each thread 4 x 4 outputs, weights
// decoded once per tile.
constexpr int kTile = 64, kTileK = 32;

__global__ void __launch_bounds__(256) linear_tiled_kernel(DeviceLinear L, const void* x, DType xdt,
                                                           int64_t n_tokens, void* out, DType odt) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float xs[kTileK][kTile + 1];
  __shared__ float ws[kTileK][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t n0 = blockIdx.x * int64_t(kTile), t0 = blockIdx.y * int64_t(kTile);
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < L.n_in; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += blockDim.x) {
      const int r = i / kTileK, kk = i % kTileK;
      const int64_t k = k0 + kk, t = t0 + r, n = n0 + r;
      xs[kk][r] = t < n_tokens && k < L.n_in ? load_float(x, t * L.n_in + k, xdt) : 0.0f;
      ws[kk][r] = n < L.n_out && k < L.n_in ? weight_at(L, n, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[4], w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i], w[i] = ws[kk][tx * 4 + i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * w[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + ty * 4 + i;
    if (t >= n_tokens) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx * 4 + j;
      if (n < L.n_out) store_float(out, t * L.n_out + n, odt, acc[i][j] + (L.bias ? load_float(L.bias, n, L.bdt) : 0.0f));
    }
  }
}

// Backend::head_linear for any weight format: one warp per (head, output column) and group
// of tokens. Plain: column r is weight row h * head_stride + row0 + r, read along k.
// Transposed: column c is column c of the head's n_rows rows, read down them.
__global__ void head_linear_kernel(DeviceLinear L, const void* x, DType xdt, int64_t n_tokens, int64_t n_heads,
                                   int64_t head_stride, int64_t row0, int64_t n_rows, bool transposed, void* out,
                                   DType odt) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t x_width = transposed ? n_rows : L.n_in, out_width = transposed ? L.n_in : n_rows;
  const int64_t col = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32, h = blockIdx.y;
  if (col >= out_width) return;
  const int64_t first_row = h * head_stride + row0;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kGroup) {
    const int g = n_tokens - t0 < kGroup ? int(n_tokens - t0) : kGroup;
    float acc[kGroup] = {};
    for (int64_t i = lane; i < x_width; i += 32) {
      const float w = transposed ? weight_at(L, first_row + i, col) : weight_at(L, first_row + col, i);
#pragma unroll
      for (int j = 0; j < kGroup; ++j)
        if (j < g) acc[j] += w * load_float(x, ((t0 + j) * n_heads + h) * x_width + i, xdt);
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const float s = warp_sum(acc[j]);
      if (lane == 0 && j < g) store_float(out, ((t0 + j) * n_heads + h) * out_width + col, odt, s);
    }
  }
}

DeviceLinear device_linear(const LinearWeight& w) {
  return {w.weight.data, w.weight.dtype, w.format, w.block_scale.as<const uint8_t>(), w.global_scale,
          w.n_out, w.n_in, w.bias.empty() ? nullptr : w.bias.data, w.bias.dtype};
}

}  // namespace

void head_linear_general(const KernelLaunch& launch, TensorView x, const LinearWeight& w, int64_t head_stride,
                         int64_t row0, int64_t n_rows, bool transposed, TensorView out) {
  const int64_t n_tokens = x.dim(0), n_heads = x.dim(1);
  const int64_t out_width = transposed ? w.n_in : n_rows;
  if (n_tokens == 0 || out_width == 0) return;
  constexpr int kWarps = 8;
  TETRA_CHECK(n_heads <= 65535, "head_linear: ", n_heads, " heads is too many");
  const dim3 grid(unsigned((out_width + kWarps - 1) / kWarps), unsigned(n_heads));
  launch_kernel(launch, head_linear_kernel, grid, 32 * kWarps, 0, device_linear(w), x.data, x.dtype, n_tokens, n_heads,
                head_stride, row0, n_rows, transposed, out.data, out.dtype);
  TETRA_CUDA_CHECK_LAUNCH("head_linear");
}

void linear_general(const KernelLaunch& launch, TensorView x, const LinearWeight& w, TensorView out) {
  const int64_t n_tokens = w.n_in ? x.numel() / w.n_in : 0;
  TETRA_CHECK(x.dim(-1) == w.n_in && out.dim(-1) == w.n_out && out.numel() == n_tokens * w.n_out,
              "linear: input width ", x.dim(-1), " and output width ", out.dim(-1), " do not match a weight of ",
              w.n_out, "x", w.n_in);
  TETRA_CHECK((x.dtype == DType::BF16 || x.dtype == DType::F32) && (out.dtype == DType::BF16 || out.dtype == DType::F32),
              "linear: x and out must be BF16 or F32 on CUDA");
  const DeviceLinear L = device_linear(w);
  if (w.format == WeightFormat::Nvfp4)
    TETRA_CHECK(w.n_in % 16 == 0 && w.weight.dtype == DType::U8 && !w.block_scale.empty(),
                "linear: NVFP4 weights need U8 codes, block scales and a width that is a multiple of 16");
  if (n_tokens == 0 || w.n_out == 0) return;
  if (n_tokens <= 2 * kGroup) {
    constexpr int kWarps = 8;
    launch_kernel(launch, linear_rows_kernel, int((w.n_out + kWarps - 1) / kWarps), 32 * kWarps, 0, L, x.data, x.dtype,
                  n_tokens, out.data, out.dtype);
  } else {
    const dim3 grid(unsigned((w.n_out + kTile - 1) / kTile), unsigned((n_tokens + kTile - 1) / kTile));
    TETRA_CHECK(grid.y <= 65535, "linear: too many tokens for one launch");
    launch_kernel(launch, linear_tiled_kernel, grid, 256, 0, L, x.data, x.dtype, n_tokens, out.data, out.dtype);
  }
  TETRA_CUDA_CHECK_LAUNCH("linear");
}

}  // namespace tetra::ops::cuda
