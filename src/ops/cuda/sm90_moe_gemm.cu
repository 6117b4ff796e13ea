// The grouped expert GEMMs of the MoE layer, weight-streaming form (sm_90a, mma.sync).
//
// Decode is bound by the bytes of the experts a batch touches, so the kernels are built to
// stream weights: every warp owns 16 weight rows (the MMA's M) of one or two matrices and
// walks the whole K dimension, with the tokens of one work item as the MMA's N (8, 16 or 32:
// the "swapped" A/B of a GEMV). NVFP4 tiles of 64 to 256 tokens go to sm90_moe_wgmma.cu.
// Weight bytes are read exactly once per work item, NVFP4 ones through a per-warp ring in
// shared memory that holds the bytes in flight in place of registers; the activations (a few
// KB per item) come through L1. The warp's streaming loop and its K order are in
// sm90_moe_stream.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/sm90_moe_stream.cuh"

namespace tetra::ops::cuda {
namespace {

using namespace moe_stream;

// A warp's two tiles over its share of K: NVFP4 through a ring of kS slots in shared memory
// (3 slots: 80 registers, 30 KB a block, so 6 blocks an SM for tiles of 8; 4 slots kept fewer
// warps and measured slower), BF16 through kS register stages.
template <bool kFp4, int kNT, int kS, int kSplit>
__device__ __forceinline__ void stream_tiles(const WarpOperands<2, kNT>& op, const BlockRole<kSplit>& role,
                                             float (&acc)[2][kNT][4]) {
  if constexpr (kFp4) {
    __shared__ WarpRing<2, kS> ring[kWarps];
    gemm_warp_ring<2, kNT, kS>(ring[threadIdx.x >> 5], op, role.c_begin, role.c_end, acc);
  } else {
    gemm_warp<false, 2, kNT, kS>(op, role.c_begin, role.c_end, acc);
  }
}

// h[row, n] = silu(x W_gate^T) * (x W_up^T) for the tokens of one work item; blockIdx.y
// picks 16 * kWarps / kSplit of the I columns. NVFP4: each of a warp's two tiles is 8 columns,
// gate rows over up rows (nvfp4_tile.h). BF16: a gate tile and the matching up tile.
template <bool kFp4, int kNT, int kS, int kSplit>
__global__ void __launch_bounds__(kWarps * 32, min_blocks(kNT)) gate_up_kernel(MoeGemmParams p) {
  pdl_wait();
  pdl_launch_dependents();
  if (int(blockIdx.x) >= *p.n_items) return;  // the whole block leaves together
  const MoeWorkItem item = p.items[blockIdx.x];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const BlockRole<kSplit> role(p.k / kMoeChunkK);
  const int n0 = (blockIdx.y * (kWarps / kSplit) + role.tile) * 16;
  const int rows[2] = {kFp4 ? 2 * n0 : n0, kFp4 ? 2 * n0 + 16 : p.n + n0};
  WarpOperands<2, kNT> op;
  warp_operands<kFp4, 2, kNT>(p, item, rows, op);
  float acc[2][kNT][4];
  stream_tiles<kFp4, kNT, kS>(op, role, acc);
  reduce_split_k<2, kNT, kSplit>(acc, role.kpart, role.tile);
  if (role.kpart != 0) return;

  const float unscale = kFp4 ? 256.0f : 1.0f;  // the 2^-8 left in the decoded weights
  const float gs_gate = p.global_scale[item.expert * 3 + 0] * unscale;
  const float gs_up = p.global_scale[item.expert * 3 + 1] * unscale;
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int slot = 8 * n + 2 * t + e;
        if (slot >= item.n_rows) continue;
        // Column n0 + 8m + g. NVFP4: tile m's row g is its gate (accumulators 0, 1) and row g + 8
        // its up (2, 3). BF16: tile 0 is gate and tile 1 up, rows g + 8m of each.
        const float gate = (kFp4 ? acc[m][n][e] : acc[0][n][2 * m + e]) * gs_gate;
        const float up = (kFp4 ? acc[m][n][2 + e] : acc[1][n][2 * m + e]) * gs_up;
        const float hv = gate / (1.0f + __expf(-gate)) * up;
        __nv_bfloat16 hb = __float2bfloat16_rn(hv);
        p.h[int64_t(item.row_begin + slot) * p.n + n0 + 8 * m + g] = *reinterpret_cast<uint16_t*>(&hb);
      }
}

// y[row, n] = h W_down^T for the tokens of one work item; each row tile is 32 rows of W_down.
template <bool kFp4, int kNT, int kS, int kSplit>
__global__ void __launch_bounds__(kWarps * 32, min_blocks(kNT)) down_kernel(MoeGemmParams p) {
  pdl_wait();
  pdl_launch_dependents();
  if (int(blockIdx.x) >= *p.n_items) return;
  const MoeWorkItem item = p.items[blockIdx.x];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const BlockRole<kSplit> role(p.k / kMoeChunkK);
  const int n0 = (blockIdx.y * (kWarps / kSplit) + role.tile) * 32;
  const int rows[2] = {n0, n0 + 16};
  WarpOperands<2, kNT> op;
  warp_operands<kFp4, 2, kNT>(p, item, rows, op);
  float acc[2][kNT][4];
  stream_tiles<kFp4, kNT, kS>(op, role, acc);
  reduce_split_k<2, kNT, kSplit>(acc, role.kpart, role.tile);
  if (role.kpart != 0) return;

  const float gs = p.global_scale[item.expert * 3 + 2] * (kFp4 ? 256.0f : 1.0f);
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int slot = 8 * n + 2 * t + (i & 1);
        if (slot >= item.n_rows) continue;
        const int col = n0 + 16 * m + g + (i >= 2 ? 8 : 0);
        p.y[int64_t(item.row_begin + slot) * p.n + col] = acc[m][n][i] * gs;
      }
}

// Splitting K inside the block gives few-token batches more, shorter blocks; one row tile
// per warp lets the block's 4 warps share their activations through L1. BF16 tiles of 8 and
// 16 split 4 ways for gate/up (K = H, 48 chunks on GLM-5) and 2 for down (K = I, 16 chunks).
// NVFP4 tiles, whose rings fit 6 blocks an SM, measured 2-10% faster splitting less: tiles of
// 8 split gate/up 2 ways and down not at all, tiles of 16 split neither (docs/PERF.md).
template <bool kFp4, int kNT, int kS, int kSplitGateUp, int kSplitDown>
void launch_pair(const KernelLaunch& launch, const MoeGemmParams& p, int max_items, bool gate_up) {
  const dim3 block(kWarps * 32);
  if (gate_up) {
    constexpr int kRows = 16 * kWarps / kSplitGateUp;  // columns of h a block owns
    launch_kernel(launch, gate_up_kernel<kFp4, kNT, kS, kSplitGateUp>, dim3(max_items, p.n / kRows), block, 0, p);
  } else {
    constexpr int kRows = 32 * kWarps / kSplitDown;  // rows of W_down a block owns
    launch_kernel(launch, down_kernel<kFp4, kNT, kS, kSplitDown>, dim3(max_items, p.n / kRows), block, 0, p);
  }
}

template <bool kFp4>
void launch_gemm(const KernelLaunch& launch, const MoeGemmParams& p, int tile_tokens, int max_items, bool gate_up) {
  switch (tile_tokens) {
    case 8: launch_pair<kFp4, 1, kFp4 ? 3 : 2, kFp4 ? 2 : 4, kFp4 ? 1 : 2>(launch, p, max_items, gate_up); break;
    case 16: launch_pair<kFp4, 2, kFp4 ? 3 : 2, kFp4 ? 1 : 4, kFp4 ? 1 : 2>(launch, p, max_items, gate_up); break;
    case 32: launch_pair<kFp4, 4, kFp4 ? 3 : 2, 1, 1>(launch, p, max_items, gate_up); break;
    case 64: launch_pair<kFp4, 8, 2, 1, 1>(launch, p, max_items, gate_up); break;
    default:
      fail("moe: tile_tokens must be 8, 16, 32 or 64", kFp4 ? " (128, 192 or 256 for NVFP4)" : "", ", not ",
           tile_tokens);
  }
}

}  // namespace

MoeGemmParams moe_gemm_params(const CudaMoeExperts& ex, const MoeScratch& s, bool gate_up) {
  const bool fp4 = ex.format == WeightFormat::Nvfp4;
  const int64_t H = ex.shape.hidden, I = ex.shape.intermediate;
  const int64_t k = gate_up ? H : I;
  MoeGemmParams p{};
  p.n_items = s.n_items;
  p.items = s.items;
  p.w = static_cast<const uint8_t*>(gate_up ? ex.w13 : ex.w2);
  p.w_scale = gate_up ? ex.w13_scale : ex.w2_scale;
  p.global_scale = ex.global_scale;
  p.w_expert_bytes = gate_up ? ex.w13_expert_bytes() : ex.w2_expert_bytes();
  p.w_row_bytes = fp4 ? k / 2 : k * 2;
  p.s_expert_bytes = gate_up ? ex.w13_scale_expert_bytes() : ex.w2_scale_expert_bytes();
  p.k = int(k);
  p.n = int(gate_up ? I : H);
  p.h = s.h;
  p.y = s.y;
  return p;
}

void launch_gate_up(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* x,
                    const MoeScratch& s, int tile_tokens) {
  if (moe_uses_wgmma(ex.format, tile_tokens)) return launch_gate_up_wgmma(launch, ex, x, s, tile_tokens);
  MoeGemmParams p = moe_gemm_params(ex, s, true);
  p.b = x;
  p.b_rows = s.row_token;
  if (ex.format == WeightFormat::Nvfp4)
    launch_gemm<true>(launch, p, tile_tokens, s.max_items, true);
  else
    launch_gemm<false>(launch, p, tile_tokens, s.max_items, true);
}

void launch_down(const KernelLaunch& launch, const CudaMoeExperts& ex, const MoeScratch& s,
                 int tile_tokens) {
  if (moe_uses_wgmma(ex.format, tile_tokens)) return launch_down_wgmma(launch, ex, s, tile_tokens);
  MoeGemmParams p = moe_gemm_params(ex, s, false);
  p.b = s.h;
  p.b_rows = nullptr;
  if (ex.format == WeightFormat::Nvfp4)
    launch_gemm<true>(launch, p, tile_tokens, s.max_items, false);
  else
    launch_gemm<false>(launch, p, tile_tokens, s.max_items, false);
}

}  // namespace tetra::ops::cuda
