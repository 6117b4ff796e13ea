#include "ops/cuda/gemv.h"

#include <cuda_bf16.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

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

// Up to kMaxParts linears of one input in one launch; global row r belongs to the part whose
// [row0, row0 + n_out) holds it.
constexpr int kMaxParts = 4;
struct Part {
  const uint16_t* w;
  const void* bias;
  DType bdt;
  void* out;
  int64_t n_out, row0;
};
struct Parts {
  Part p[kMaxParts];
  int n;
  int64_t rows;
};

// Warp `r` streams weight row r in 16-byte chunks (lane j takes chunks j, j + 32, ...), dots
// each with the same chunk of every token's x, and sums its lanes in a fixed tree.
template <int kTokens>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const Parts parts, const uint16_t* __restrict__ x,
                                                         DType odt, int64_t n_in) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= parts.rows) return;
  int k = 0;
  while (k + 1 < parts.n && r >= parts.p[k + 1].row0) ++k;
  const Part& part = parts.p[k];
  const int64_t n = r - part.row0;
  const int64_t chunks = n_in / 8;
  const uint4* wrow = reinterpret_cast<const uint4*>(part.w + n * n_in);
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
  const float b = part.bias ? load_float(part.bias, n, part.bdt) : 0.0f;
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float s = acc[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) store_float(part.out, t * part.n_out + n, odt, s + b);
  }
}

template <int kTokens>
void launch_gemv(const KernelLaunch& launch, const Parts& parts, TensorView x, DType odt, int64_t n_in) {
  launch_kernel(launch, gemv_kernel<kTokens>, unsigned((parts.rows + kWarps - 1) / kWarps), kWarps * 32, 0, parts,
                x.as<const uint16_t>(), odt, n_in);
}

// Whether one linear of x qualifies (see gemv.h).
bool qualifies(TensorView x, const LinearWeight& w, TensorView out) {
  if (w.format != WeightFormat::Dense || w.weight.dtype != DType::BF16 || x.dtype != DType::BF16) return false;
  if (out.dtype != DType::BF16 && out.dtype != DType::F32) return false;
  if (w.n_in % 8 != 0 || !aligned16(w.weight.data) || !aligned16(x.data)) return false;
  const int64_t t = x.numel() / w.n_in;
  return t >= 1 && t <= kGemvMaxTokens;
}

bool run(const KernelLaunch& launch, TensorView x, std::span<const LinearPart> parts) {
  if (parts.empty() || int64_t(parts.size()) > kMaxParts) return false;
  const LinearWeight& w0 = *parts[0].weight;
  Parts table{};
  for (const LinearPart& p : parts) {
    const LinearWeight& w = *p.weight;
    if (!qualifies(x, w, p.out) || w.n_in != w0.n_in || p.out.dtype != parts[0].out.dtype) return false;
    table.p[table.n++] = {w.weight.as<const uint16_t>(), w.bias.empty() ? nullptr : w.bias.data, w.bias.dtype,
                          p.out.data, w.n_out, table.rows};
    table.rows += w.n_out;
  }
  if ((table.rows + kWarps - 1) / kWarps > INT32_MAX) return false;
  const DType odt = parts[0].out.dtype;
  switch (x.numel() / w0.n_in) {
    case 1: launch_gemv<1>(launch, table, x, odt, w0.n_in); break;
    case 2: launch_gemv<2>(launch, table, x, odt, w0.n_in); break;
    case 3: launch_gemv<3>(launch, table, x, odt, w0.n_in); break;
    case 4: launch_gemv<4>(launch, table, x, odt, w0.n_in); break;
    case 5: launch_gemv<5>(launch, table, x, odt, w0.n_in); break;
    case 6: launch_gemv<6>(launch, table, x, odt, w0.n_in); break;
    case 7: launch_gemv<7>(launch, table, x, odt, w0.n_in); break;
    default: launch_gemv<8>(launch, table, x, odt, w0.n_in); break;
  }
  TETRA_CUDA_CHECK_LAUNCH("gemv_bf16");
  return true;
}

}  // namespace

bool gemv_bf16(const KernelLaunch& launch, TensorView x, const LinearWeight& w, TensorView out) {
  const LinearPart part{&w, out};
  return run(launch, x, std::span<const LinearPart>(&part, 1));
}

bool gemv_bf16(const KernelLaunch& launch, TensorView x, std::span<const LinearPart> parts) {
  return run(launch, x, parts);
}

}  // namespace tetra::ops::cuda
