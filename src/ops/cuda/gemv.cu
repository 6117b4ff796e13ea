#include "ops/cuda/gemv.h"

#include <cuda_bf16.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kWarps = 8;  // a block: 8 warps, split_for(n_in) of them a row

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

// Weight chunks a lane loads before it computes (16 bytes each). Up to 4 tokens, 4: few
// registers, so all the rows of a q/k/v projection are resident at once (with 8 it took 64
// registers, ran in two waves, and a 1-token step was 0.09-0.16 ms slower); from 5 tokens, 8
// (docs/PERF.md). Past 8 tokens the FMAs, not the bytes, would set the pace: cuBLASLt's tensor
// cores take those.
constexpr int batch_for(int tokens) { return tokens <= 4 ? 4 : 8; }

// Warps per output row: enough that a warp's share of K is at most 256 chunks, one batch of 8
// a lane (n_in 2048: 1 warp; 4096: 2; 6144 or 7168: 4), at most 8. It depends on n_in alone,
// never on T or the parts of a launch, so each output keeps one summation order whatever the
// batch.
int split_for(int64_t n_in) {
  const int64_t chunks = n_in / 8, per_warp = 32 * batch_for(kGemvMaxTokens);
  int split = 1;
  while (split < kWarps && chunks > split * per_warp) split *= 2;
  return split;
}

// `kSplit` warps share row r: warp s of them streams its 16-byte chunks s * 32 + lane +
// 32 * kSplit * i (a warp's loads of one step are 512 contiguous bytes), a batch at a time,
// dots each with the same chunk of every token's x, and sums its lanes in a fixed tree; the
// row's first warp adds the warps' sums in warp order. A lane's chunks are summed in ascending
// order whatever the batch size, so the result does not depend on T.
template <int kTokens, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const Parts parts, const uint16_t* __restrict__ x,
                                                         DType odt, int64_t n_in) {
  constexpr int kRowsPerBlock = kWarps / kSplit, kBatch = batch_for(kTokens);
  __shared__ float partial[kSplit > 1 ? kWarps : 1][kTokens];
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, s = warp % kSplit;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + warp / kSplit;
  const bool active = r < parts.rows;  // no early exit: the block meets at a barrier below
  int k = 0;
  while (k + 1 < parts.n && r >= parts.p[k + 1].row0) ++k;
  const Part& part = parts.p[k];
  const int64_t n = r - part.row0;
  // 32-bit chunk indices (run() checks n_in): fewer registers.
  const int x_chunks = int(n_in / 8), chunks = active ? x_chunks : 0, step = 32 * kSplit;
  const uint4* wrow = reinterpret_cast<const uint4*>(part.w + n * n_in);
  const uint4* xg = reinterpret_cast<const uint4*>(x);
  float acc[kTokens] = {};
  for (int base = s * 32 + lane; base < chunks; base += step * kBatch) {
    uint4 w[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (base + i * step < chunks) w[i] = __ldg(wrow + base + i * step);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int c = base + i * step;
      if (c >= chunks) break;
      float wf[8];
      bf16x8_to_float(w[i], wf);
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        float xf[8];
        bf16x8_to_float(__ldg(xg + t * x_chunks + c), xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  if constexpr (kSplit > 1) {
    if (lane == 0)
#pragma unroll
      for (int t = 0; t < kTokens; ++t) partial[warp][t] = acc[t];
    __syncthreads();
    if (s != 0) return;
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      acc[t] = partial[warp][t];
#pragma unroll
      for (int i = 1; i < kSplit; ++i) acc[t] += partial[warp + i][t];
    }
  }
  if (!active || lane != 0) return;
  const float b = part.bias ? load_float(part.bias, n, part.bdt) : 0.0f;
#pragma unroll
  for (int t = 0; t < kTokens; ++t) store_float(part.out, t * part.n_out + n, odt, acc[t] + b);
}

template <int kTokens, int kSplit>
void launch_split(const KernelLaunch& launch, const Parts& parts, TensorView x, DType odt, int64_t n_in) {
  constexpr int kRowsPerBlock = kWarps / kSplit;
  launch_kernel(launch, gemv_kernel<kTokens, kSplit>, unsigned((parts.rows + kRowsPerBlock - 1) / kRowsPerBlock),
                kWarps * 32, 0, parts, x.as<const uint16_t>(), odt, n_in);
}

template <int kTokens>
void launch_gemv(const KernelLaunch& launch, const Parts& parts, TensorView x, DType odt, int64_t n_in) {
  switch (split_for(n_in)) {
    case 1: return launch_split<kTokens, 1>(launch, parts, x, odt, n_in);
    case 2: return launch_split<kTokens, 2>(launch, parts, x, odt, n_in);
    case 4: return launch_split<kTokens, 4>(launch, parts, x, odt, n_in);
    default: return launch_split<kTokens, 8>(launch, parts, x, odt, n_in);
  }
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
  // Blocks of one row at the most; the kernel indexes x's 16-byte chunks in 32 bits.
  if (table.rows > INT32_MAX || w0.n_in / 8 * kGemvMaxTokens > INT32_MAX) return false;
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
