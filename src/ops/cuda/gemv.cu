#include "ops/cuda/gemv.h"

#include <cuda_bf16.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kWarps = 8;  // a block: 8 warps, one output row each

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Warp `n` streams weight row n in 16-byte chunks (lane j takes chunks j, j + 32, ...), dots
// each with the same chunk of every token's x, and sums its lanes in a fixed tree.
template <int kTokens>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x,
                                                         const void* bias, DType bdt, void* out, DType odt,
                                                         int64_t n_out, int64_t n_in) {
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= n_out) return;
  const int64_t chunks = n_in / 8;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + n * n_in);
  float acc[kTokens] = {};
#pragma unroll 4
  for (int64_t c = lane; c < chunks; c += 32) {
    float wf[8];
    bf16x8_to_float(__ldg(wrow + c), wf);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float xf[8];
      bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x + t * n_in) + c), xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[t] = fmaf(wf[i], xf[i], acc[t]);
    }
  }
  const float b = bias ? load_float(bias, n, bdt) : 0.0f;
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float s = acc[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) store_float(out, t * n_out + n, odt, s + b);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int kTokens>
void launch(cudaStream_t stream, TensorView x, const LinearWeight& w, TensorView out) {
  const unsigned blocks = unsigned((w.n_out + kWarps - 1) / kWarps);
  gemv_kernel<kTokens><<<blocks, kWarps * 32, 0, stream>>>(w.weight.as<const uint16_t>(), x.as<const uint16_t>(),
                                                           w.bias.empty() ? nullptr : w.bias.data, w.bias.dtype,
                                                           out.data, out.dtype, w.n_out, w.n_in);
}

}  // namespace

bool gemv_bf16(cudaStream_t stream, TensorView x, const LinearWeight& w, TensorView out) {
  if (w.format != WeightFormat::Dense || w.weight.dtype != DType::BF16 || x.dtype != DType::BF16) return false;
  if (out.dtype != DType::BF16 && out.dtype != DType::F32) return false;
  if (w.n_in % 8 != 0 || !aligned16(w.weight.data) || !aligned16(x.data)) return false;
  const int64_t t = x.numel() / w.n_in;
  if (t < 1 || t > kGemvMaxTokens || (w.n_out + kWarps - 1) / kWarps > INT32_MAX) return false;
  switch (t) {
    case 1: launch<1>(stream, x, w, out); break;
    case 2: launch<2>(stream, x, w, out); break;
    case 3: launch<3>(stream, x, w, out); break;
    case 4: launch<4>(stream, x, w, out); break;
    case 5: launch<5>(stream, x, w, out); break;
    case 6: launch<6>(stream, x, w, out); break;
    case 7: launch<7>(stream, x, w, out); break;
    default: launch<8>(stream, x, w, out); break;
  }
  TETRA_CUDA_CHECK_LAUNCH("gemv_bf16");
  return true;
}

}  // namespace tetra::ops::cuda
