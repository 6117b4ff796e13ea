#include "ops/cuda/gemm_skinny.h"

#include <climits>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/sm90_moe_stream.cuh"

namespace tetra::ops::cuda {
namespace {

using namespace moe_stream;

// Up to kMaxParts linears in one launch; 16-row tile i belongs to the part whose
// [tile0, tile0 + n_out / 16) holds it.
constexpr int kMaxParts = 4;
struct SkinnyPart {
  const uint16_t* w;
  const void* bias;
  DType bdt;
  void* out;
  int n_out, tile0;
};
struct SkinnyParams {
  SkinnyPart p[kMaxParts];
  int n_parts, n_tiles;
  const uint16_t* x;
  int n_tokens, n_in;
  DType odt;
};

// A block is one 16-row tile of W: its 4 warps each walk a quarter of K (the chunks of
// BlockRole), the tokens of x as kNT MMA columns of 8, and the first warp adds the others'
// sums in warp order and writes the tile's outputs.
template <int kNT, int kS>
__global__ void __launch_bounds__(kWarps * 32) skinny_kernel(const SkinnyParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const int tile = blockIdx.x;
  int k = 0;
  while (k + 1 < p.n_parts && tile >= p.p[k + 1].tile0) ++k;
  const SkinnyPart& part = p.p[k];
  const int n0 = (tile - part.tile0) * 16;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const BlockRole<kWarps> role(p.n_in / kMoeChunkK);
  WarpOperands<1, kNT> op;
  op.a_stride8 = 8 * p.n_in * 2;
  op.a[0] = reinterpret_cast<const uint8_t*>(part.w + int64_t(n0 + g) * p.n_in) + 64 * t;
  op.s[0] = nullptr;
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    const int token = g + 8 * n;
    op.b[n] = token < p.n_tokens ? p.x + int64_t(token) * p.n_in + 32 * t : nullptr;
  }
  float acc[1][kNT][4];
  gemm_warp<false, 1, kNT, kS>(op, role.c_begin, role.c_end, acc);
  reduce_split_k<1, kNT, kWarps>(acc, role.kpart, role.tile);
  if (role.kpart != 0) return;
  // acc[0][n][i] is row n0 + g (+ 8 for i >= 2) of W against token 8 n + 2 t + (i & 1).
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = n0 + g + (i >= 2 ? 8 : 0);
    const float b = part.bias ? load_float(part.bias, row, part.bdt) : 0.0f;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const int token = 8 * n + 2 * t + (i & 1);
      if (token < p.n_tokens) store_float(part.out, int64_t(token) * part.n_out + row, p.odt, acc[0][n][i] + b);
    }
  }
}

template <int kNT, int kS>
void launch_skinny(const KernelLaunch& launch, const SkinnyParams& p) {
  launch_kernel(launch, skinny_kernel<kNT, kS>, unsigned(p.n_tiles), kWarps * 32, 0, p);
}

bool qualifies(TensorView x, const LinearWeight& w, TensorView out) {
  if (w.format != WeightFormat::Dense || w.weight.dtype != DType::BF16 || x.dtype != DType::BF16) return false;
  if (out.dtype != DType::BF16 && out.dtype != DType::F32) return false;
  if (w.n_in % kMoeChunkK != 0 || w.n_out % 16 != 0 || !aligned16(w.weight.data) || !aligned16(x.data)) return false;
  if (w.n_in > INT_MAX / kSkinnyMaxTokens || w.n_out > INT_MAX / kSkinnyMaxTokens) return false;
  const int64_t t = x.numel() / w.n_in;
  return t >= kSkinnyMinTokens && t <= kSkinnyMaxTokens;
}

}  // namespace

bool gemm_skinny_bf16(const KernelLaunch& launch, TensorView x, std::span<const LinearPart> parts) {
  if (parts.empty() || int64_t(parts.size()) > kMaxParts) return false;
  const LinearWeight& w0 = *parts[0].weight;
  SkinnyParams p{};
  int64_t tiles = 0;
  for (const LinearPart& part : parts) {
    const LinearWeight& w = *part.weight;
    if (!qualifies(x, w, part.out) || w.n_in != w0.n_in || part.out.dtype != parts[0].out.dtype) return false;
    p.p[p.n_parts++] = {w.weight.as<const uint16_t>(), w.bias.empty() ? nullptr : w.bias.data, w.bias.dtype,
                        part.out.data, int(w.n_out), int(tiles)};
    tiles += w.n_out / 16;
  }
  if (tiles > INT_MAX) return false;
  p.n_tiles = int(tiles);
  p.x = x.as<const uint16_t>();
  p.n_tokens = int(x.numel() / w0.n_in);
  p.n_in = int(w0.n_in);
  p.odt = parts[0].out.dtype;
  // Two register stages (one in flight, 4 KB a warp), as the MoE's BF16 tiles: with three,
  // 160-190 registers fit 2 blocks an SM and a q/k/v projection's 320 tiles took two waves.
  if (p.n_tokens <= 16)
    launch_skinny<2, 2>(launch, p);
  else if (p.n_tokens <= 32)
    launch_skinny<4, 2>(launch, p);
  else
    launch_skinny<8, 2>(launch, p);
  TETRA_CUDA_CHECK_LAUNCH("gemm_skinny_bf16");
  return true;
}

}  // namespace tetra::ops::cuda
