// The grouped expert GEMMs of the MoE layer, weight-streaming form (sm_90a, mma.sync).
//
// Decode is bound by the bytes of the experts a batch touches, so the kernels are built to
// stream weights: every warp owns 16 weight rows (the MMA's M) of one or two matrices and
// walks the whole K dimension, with the tokens of one work item as the MMA's N (8, 16 or 32:
// the "swapped" A/B of a GEMV). NVFP4 tiles of 64 to 256 tokens go to sm90_moe_wgmma.cu. Weight bytes are read exactly once per work item and never
// staged through shared memory; the activations (a few KB per item) come through L1.
//
// K order inside a 128-wide chunk: lane (g, t) of the mma fragment owns the 32 consecutive
// values k = 32t .. 32t+31 of its rows, and MMA k-step j (of 8) uses values 4j..4j+3 of
// them. The reduction does not care about the order, and A (weights) and B (activations)
// use the same one, so every lane loads 16 contiguous bytes of NVFP4 per row (64 of BF16)
// and one 2-byte pair of block scales, and the 4 lanes of a row read 64 contiguous bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/sm90_nvfp4_decode.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block; each owns a 16-row weight tile (x2 matrices)
static_assert(kMoeChunkK == 4 * 32, "a chunk is 4 lanes x 32 values along K");

__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1,
                                                 uint32_t a2, uint32_t a3, uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One stage of the register pipeline: a lane's share of the weights of one 128-wide K chunk.
// Activations are not staged: they are L1/L2 hits, loaded next to their use, which keeps the
// registers (and so the warps per SM that hide the weight stream's latency) in budget.
template <bool kFp4, int kMT>
struct Stage {
  static constexpr int kVecPerRow = kFp4 ? 1 : 4;  // 16-byte vectors per row per lane
  uint4 a[kMT][2][kVecPerRow];                     // rows g and g+8 of each tile
  uint32_t s[kMT][2];                              // two E4M3 scales (Nvfp4 only)
};

// A warp's view of its operands: row pointers already offset to the lane's share.
// Rows g and g+8 of a tile are 8 rows apart: one pointer and one stride each saves registers.
template <int kMT, int kNT>
struct WarpOperands {
  const uint8_t* a[kMT];   // row g of each tile
  const uint8_t* s[kMT];   // its scales (Nvfp4 only)
  int a_stride8, s_stride8;  // bytes from row g to row g+8
  const uint16_t* b[kNT];  // null where the token slot is empty
};

template <bool kFp4, int kMT, int kNT>
__device__ __forceinline__ void load_stage(Stage<kFp4, kMT>& st, const WarpOperands<kMT, kNT>& op,
                                           int chunk) {
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t* a = op.a[m] + r * op.a_stride8;
      if constexpr (kFp4) {
        st.a[m][r][0] = ld_stream_v4(a + chunk * 64);
        st.s[m][r] = ld_stream_u16(op.s[m] + r * op.s_stride8 + chunk * 8);
      } else {
#pragma unroll
        for (int v = 0; v < 4; ++v) st.a[m][r][v] = ld_stream_v4(a + chunk * 256 + 16 * v);
      }
    }
}

template <bool kFp4, int kMT, int kNT>
__device__ __forceinline__ void compute_stage(const Stage<kFp4, kMT>& st,
                                              const WarpOperands<kMT, kNT>& op, int chunk,
                                              float (&acc)[kMT][kNT][4]) {
  uint32_t sc[kMT][2][2];
  if constexpr (kFp4) {
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) scale_pair_to_bf16x2(st.s[m][r], sc[m][r][0], sc[m][r][1]);
  }
  // Word w of the lane's 32 values holds values 8w..8w+7: k-steps 2w and 2w+1.
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint4 b[kNT];
#pragma unroll
    for (int n = 0; n < kNT; ++n)
      b[n] = op.b[n] ? __ldg(reinterpret_cast<const uint4*>(op.b[n] + chunk * 128) + w)
                     : make_uint4(0, 0, 0, 0);
    uint32_t a[2][kMT][4];  // [k-step][tile][mma A register]
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (kFp4) {
          const uint32_t q = word(st.a[m][r][0], w);
          const uint32_t s = sc[m][r][w >> 1];
          a[0][m][r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q), s);            // values 0, 1
          a[0][m][2 + r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q << 4), s);   // values 2, 3
          a[1][m][r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q << 8), s);       // values 4, 5
          a[1][m][2 + r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q << 12), s);  // values 6, 7
        } else {
          const uint4 v = st.a[m][r][w];
          a[0][m][r] = v.x;
          a[0][m][2 + r] = v.y;
          a[1][m][r] = v.z;
          a[1][m][2 + r] = v.w;
        }
      }
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        mma_bf16_16x8x16(acc[m][n], a[0][m][0], a[0][m][1], a[0][m][2], a[0][m][3], b[n].x, b[n].y);
        mma_bf16_16x8x16(acc[m][n], a[1][m][0], a[1][m][1], a[1][m][2], a[1][m][3], b[n].z, b[n].w);
      }
  }
}

// The main loop over chunks [c_begin, c_end): kS stages in flight, so each lane has
// (kS - 1) * kMT * 2 weight loads pending while it computes.
template <bool kFp4, int kMT, int kNT, int kS>
__device__ __forceinline__ void gemm_warp(const WarpOperands<kMT, kNT>& op, int c_begin, int c_end,
                                          float (&acc)[kMT][kNT][4]) {
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;
  Stage<kFp4, kMT> st[kS];
#pragma unroll
  for (int s = 0; s < kS - 1; ++s)
    if (c_begin + s < c_end) load_stage(st[s], op, c_begin + s);
  for (int c = c_begin; c < c_end; c += kS) {
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const int next = c + s + kS - 1;
      if (next < c_end) load_stage(st[(s + kS - 1) % kS], op, next);
      if (c + s < c_end) compute_stage(st[s], op, c + s, acc);
    }
  }
}

// Sums the partial accumulators of the kSplit warps that share a tile (each walked its own
// K range); the warp with kpart 0 ends up with the total. Called by the whole block.
template <int kMT, int kNT, int kSplit>
__device__ __forceinline__ void reduce_split_k(float (&acc)[kMT][kNT][4], int kpart, int tile) {
  if constexpr (kSplit > 1) {
    constexpr int kTiles = kWarps / kSplit;
    __shared__ float red[kTiles][kSplit - 1][kMT * kNT * 4][32];
    const int lane = threadIdx.x & 31;
    if (kpart > 0) {
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int n = 0; n < kNT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[tile][kpart - 1][(m * kNT + n) * 4 + i][lane] = acc[m][n][i];
    }
    __syncthreads();
    if (kpart == 0) {
#pragma unroll
      for (int p = 0; p < kSplit - 1; ++p)
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int n = 0; n < kNT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][n][i] += red[tile][p][(m * kNT + n) * 4 + i][lane];
    }
  }
}

template <bool kFp4, int kMT, int kNT>
__device__ __forceinline__ void warp_operands(const MoeGemmParams& p, const MoeWorkItem& item,
                                              const int (&rows)[kMT], WarpOperands<kMT, kNT>& op) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint8_t* w = p.w + item.expert * p.w_expert_bytes;
  const uint8_t* s = kFp4 ? p.w_scale + item.expert * p.s_expert_bytes : nullptr;
  op.a_stride8 = int(8 * p.w_row_bytes);
  op.s_stride8 = int(8 * p.s_row_bytes);
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    const int row = rows[m] + g;
    op.a[m] = w + row * p.w_row_bytes + (kFp4 ? 16 * t : 64 * t);
    op.s[m] = kFp4 ? s + row * p.s_row_bytes + 2 * t : nullptr;
  }
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    const int slot = g + 8 * n;
    if (slot < item.n_rows) {
      const int prow = item.row_begin + slot;
      const int brow = p.b_rows ? p.b_rows[prow] : prow;
      op.b[n] = p.b + int64_t(brow) * p.k + 32 * t;
    } else {
      op.b[n] = nullptr;
    }
  }
}

// Warps of a block: kWarps / kSplit row tiles, each walked by kSplit warps over a 1/kSplit
// share of K. Splitting K inside the block keeps the SiLU (which needs the whole sum) in the
// epilogue while giving few-token batches 4x more, shorter blocks: better balance over the
// SMs and more weight loads in flight.
template <int kSplit>
struct BlockRole {
  int tile, kpart, c_begin, c_end;
  __device__ BlockRole(int n_chunks) {
    const int warp = threadIdx.x >> 5;
    tile = warp / kSplit;
    kpart = warp % kSplit;
    c_begin = n_chunks * kpart / kSplit;
    c_end = n_chunks * (kpart + 1) / kSplit;
  }
};

// Register budgets per token width: 1 and 2 MMA columns fit 4 blocks of 4 warps per SM.
constexpr int min_blocks(int nt) { return nt == 1 ? 4 : nt == 2 ? 3 : nt == 4 ? 2 : 1; }

// h[row, n] = silu(x W_gate^T) * (x W_up^T) for the tokens of one work item; blockIdx.y
// picks 16 * kWarps / kSplit of the I columns, gate rows and the matching up rows.
template <bool kFp4, int kNT, int kS, int kSplit>
__global__ void __launch_bounds__(kWarps * 32, min_blocks(kNT)) gate_up_kernel(MoeGemmParams p) {
  pdl_wait();
  pdl_launch_dependents();
  if (int(blockIdx.x) >= *p.n_items) return;  // the whole block leaves together
  const MoeWorkItem item = p.items[blockIdx.x];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const BlockRole<kSplit> role(p.k / kMoeChunkK);
  const int n0 = (blockIdx.y * (kWarps / kSplit) + role.tile) * 16;
  const int rows[2] = {n0, p.n + n0};  // gate rows, up rows of w13
  WarpOperands<2, kNT> op;
  warp_operands<kFp4, 2, kNT>(p, item, rows, op);
  float acc[2][kNT][4];
  gemm_warp<kFp4, 2, kNT, kS>(op, role.c_begin, role.c_end, acc);
  reduce_split_k<2, kNT, kSplit>(acc, role.kpart, role.tile);
  if (role.kpart != 0) return;

  const float unscale = kFp4 ? 256.0f : 1.0f;  // the 2^-8 left in the decoded weights
  const float gs_gate = p.global_scale[item.expert * 3 + 0] * unscale;
  const float gs_up = p.global_scale[item.expert * 3 + 1] * unscale;
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int slot = 8 * n + 2 * t + (i & 1);
      if (slot >= item.n_rows) continue;
      const float gate = acc[0][n][i] * gs_gate, up = acc[1][n][i] * gs_up;
      const float hv = gate / (1.0f + __expf(-gate)) * up;
      const int col = n0 + g + (i >= 2 ? 8 : 0);
      __nv_bfloat16 hb = __float2bfloat16_rn(hv);
      p.h[int64_t(item.row_begin + slot) * p.n + col] = *reinterpret_cast<uint16_t*>(&hb);
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
  gemm_warp<kFp4, 2, kNT, kS>(op, role.c_begin, role.c_end, acc);
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

// Few tokens a tile: split K inside the block (the weight stream is the cost): 4 ways for
// gate/up (K = H, 48 chunks on GLM-5), 2 ways for down (K = I, 16 chunks: 4 ways would leave
// a warp 4 chunks, too few to fill its pipeline). Many tokens: one row tile per warp, so the
// 4 warps of a block share their activations through L1.
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
    case 8: launch_pair<kFp4, 1, kFp4 ? 3 : 2, 4, 2>(launch, p, max_items, gate_up); break;
    case 16: launch_pair<kFp4, 2, kFp4 ? 3 : 2, 4, 2>(launch, p, max_items, gate_up); break;
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
  p.s_row_bytes = k / 16;
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
