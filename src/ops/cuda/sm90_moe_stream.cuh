// The weight-streaming warp of the mma.sync MoE kernels (sm90_moe_gemm.cu's grouped GEMMs and
// sm90_moe_decode.cu's persistent layer): every warp owns 16-row tiles of one or two weight
// matrices and walks its share of K in 128-wide chunks, the tokens of one work item as the
// MMA's N. Its stages travel through registers (gemm_warp: BF16, and the persistent layer)
// or, for the grouped NVFP4 tiles, through a ring in shared memory (gemm_warp_ring), which
// frees the registers so more warps fit an SM: docs/PERF.md measured both ways.
//
// K order inside a 128-wide chunk: lane (g, t) of the mma fragment owns the 32 consecutive
// values k = 32t .. 32t+31 of its rows, and MMA k-step j (of 8) uses values 4j..4j+3 of
// them. The reduction does not care about the order, and A (weights) and B (activations)
// use the same one, so every lane loads 16 contiguous bytes of NVFP4 per row (64 of BF16).
// NVFP4 tiles are stored in the blocks of nvfp4_tile.h: a warp's load of rows g (and of rows
// g + 8) is 512 contiguous bytes, and one 4-byte load gives a lane the scale pairs of both
// its rows. BF16 tiles stay row-major: the 4 lanes of a row read 256 contiguous bytes.
#pragma once

#include <cuda_bf16.h>

#include "ops/cuda/moe_internal.h"
#include "ops/cuda/nvfp4_tile.h"
#include "ops/cuda/sm90_nvfp4_decode.cuh"

namespace tetra::ops::cuda::moe_stream {

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
  uint32_t s[kMT];  // NVFP4: two E4M3 scales of row g, then two of row g+8
};

// A warp's view of its operands: pointers already offset to the lane's share of chunk 0.
// NVFP4: the lane's bytes of its tile's first block (row g + 8 and the next chunks at fixed
// offsets). BF16: row g of each tile, row g + 8 a_stride8 further: one pointer and one
// stride each saves registers.
template <int kMT, int kNT>
struct WarpOperands {
  const uint8_t* a[kMT];
  const uint8_t* s[kMT];   // NVFP4: the lane's scale word of the tile's first block
  int a_stride8;           // BF16: bytes from row g to row g+8
  const uint16_t* b[kNT];  // null where the token slot is empty
};

template <bool kFp4, int kMT, int kNT>
__device__ __forceinline__ void load_stage(Stage<kFp4, kMT>& st, const WarpOperands<kMT, kNT>& op,
                                           int chunk) {
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    if constexpr (kFp4) {
      const uint8_t* a = op.a[m] + chunk * kNvfp4TileCodeBytes;
      st.a[m][0][0] = ld_stream_v4(a);
      st.a[m][1][0] = ld_stream_v4(a + kNvfp4TileHalfBytes);
      st.s[m] = ld_stream_u32(op.s[m] + chunk * kNvfp4TileScaleBytes);
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int v = 0; v < 4; ++v) st.a[m][r][v] = ld_stream_v4(op.a[m] + r * op.a_stride8 + chunk * 256 + 16 * v);
    }
  }
}

template <bool kFp4, int kMT, int kNT, bool kCoherentB>
__device__ __forceinline__ void compute_stage(const Stage<kFp4, kMT>& st,
                                              const WarpOperands<kMT, kNT>& op, int chunk,
                                              float (&acc)[kMT][kNT][4]) {
  uint32_t sc[kMT][2][2];
  if constexpr (kFp4) {
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) scale_pair_to_bf16x2(st.s[m] >> (16 * r), sc[m][r][0], sc[m][r][1]);
  }
  // Word w of the lane's 32 values holds values 8w..8w+7: k-steps 2w and 2w+1.
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint4 b[kNT];
#pragma unroll
    for (int n = 0; n < kNT; ++n)
      b[n] = !op.b[n] ? make_uint4(0, 0, 0, 0)
             : kCoherentB ? __ldcg(reinterpret_cast<const uint4*>(op.b[n] + chunk * 128) + w)
                          : __ldg(reinterpret_cast<const uint4*>(op.b[n] + chunk * 128) + w);
    uint32_t a[2][kMT][4];  // [k-step][tile][mma A register]
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (kFp4) {
          const uint32_t q = word(st.a[m][r][0], w);
          const uint32_t s = sc[m][r][w >> 1];
          a[0][m][r] = bf16x2_mul(nvfp4_pair_raw<0>(q), s);      // values 0, 1
          a[0][m][2 + r] = bf16x2_mul(nvfp4_pair_raw<1>(q), s);  // values 2, 3
          a[1][m][r] = bf16x2_mul(nvfp4_pair_raw<2>(q), s);      // values 4, 5
          a[1][m][2 + r] = bf16x2_mul(nvfp4_pair_raw<3>(q), s);  // values 6, 7
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

template <int kMT, int kNT>
__device__ __forceinline__ void zero_acc(float (&acc)[kMT][kNT][4]) {
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;
}

struct NothingFirst {
  __device__ void operator()() const {}
};

// The main loop over chunks [c_begin, c_end): kS stages in flight, so each lane has
// (kS - 1) * kMT * 2 weight loads pending while it computes. kCoherentB: the activations were
// written by this kernel's other blocks, so they are read through L2, not the read-only path.
// before_b runs after the first weight loads are issued and before any activation is read
// (a wait for the activations to be ready, say).
template <bool kFp4, int kMT, int kNT, int kS, bool kCoherentB = false, typename BeforeB = NothingFirst>
__device__ __forceinline__ void gemm_warp(const WarpOperands<kMT, kNT>& op, int c_begin, int c_end,
                                          float (&acc)[kMT][kNT][4], BeforeB before_b = {}) {
  zero_acc(acc);
  Stage<kFp4, kMT> st[kS];
#pragma unroll
  for (int s = 0; s < kS - 1; ++s)
    if (c_begin + s < c_end) load_stage(st[s], op, c_begin + s);
  before_b();
  for (int c = c_begin; c < c_end; c += kS) {
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const int next = c + s + kS - 1;
      if (next < c_end) load_stage(st[(s + kS - 1) % kS], op, next);
      if (c + s < c_end) compute_stage<kFp4, kMT, kNT, kCoherentB>(st[s], op, c + s, acc);
    }
  }
}

// ---- NVFP4: the stages in a shared-memory ring ----
// Stage registers cap the bytes a warp has in flight (kS - 1 stages); a ring in shared
// memory, fed by cp.async, holds them instead, so a warp keeps kRing - 1 chunks in flight
// and its registers (so the warps an SM holds) do not grow with them. Each lane copies its
// own bytes (its 16 of rows g and g + 8 of each tile, and its scale word) into its own slots
// and reads back only those: cp.async's per-thread commit groups order everything, with no
// barrier or warp sync. A slot is refilled only after the lane's reads of it have been used.
template <int kMT, int kRing>
struct WarpRing {
  uint4 a[kRing][kMT][2][32];  // [slot][tile][row g, row g + 8][lane]
  uint32_t s[kRing][kMT][32];  // [slot][tile][lane]
};

template <int kMT, int kNT, int kRing>
__device__ __forceinline__ void ring_load(WarpRing<kMT, kRing>& ring, int slot, const WarpOperands<kMT, kNT>& op,
                                          int chunk) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    const uint8_t* a = op.a[m] + chunk * kNvfp4TileCodeBytes;
    cp_async_stream_16(&ring.a[slot][m][0][lane], a);
    cp_async_stream_16(&ring.a[slot][m][1][lane], a + kNvfp4TileHalfBytes);
    cp_async_stream_4(&ring.s[slot][m][lane], op.s[m] + chunk * kNvfp4TileScaleBytes);
  }
}

// gemm_warp for NVFP4 weights through the warp's ring (same arguments, same result).
template <int kMT, int kNT, int kRing, bool kCoherentB = false, typename BeforeB = NothingFirst>
__device__ __forceinline__ void gemm_warp_ring(WarpRing<kMT, kRing>& ring, const WarpOperands<kMT, kNT>& op,
                                               int c_begin, int c_end, float (&acc)[kMT][kNT][4],
                                               BeforeB before_b = {}) {
  static_assert(kRing >= 2, "a ring holds the chunk in use and at least one in flight");
  const int lane = threadIdx.x & 31;
  zero_acc(acc);
  // One commit group per chunk, empty past c_end, so chunk c's is always kRing - 2 from the newest.
#pragma unroll
  for (int s = 0; s < kRing - 1; ++s) {
    if (c_begin + s < c_end) ring_load(ring, s, op, c_begin + s);
    cp_async_commit();
  }
  before_b();
  int slot = 0;
  for (int c = c_begin; c < c_end; ++c) {
    cp_async_wait<kRing - 2>();
    // The slot of chunk c - 1, whose values the previous iteration has used.
    const int refill = slot == 0 ? kRing - 1 : slot - 1;
    if (c + kRing - 1 < c_end) ring_load(ring, refill, op, c + kRing - 1);
    cp_async_commit();
    Stage<true, kMT> st;
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      st.a[m][0][0] = ring.a[slot][m][0][lane];
      st.a[m][1][0] = ring.a[slot][m][1][lane];
      st.s[m] = ring.s[slot][m][lane];
    }
    compute_stage<true, kMT, kNT, kCoherentB>(st, op, c, acc);
    slot = slot + 1 == kRing ? 0 : slot + 1;
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

// rows: the first row of each of the warp's tiles (multiples of 16).
template <bool kFp4, int kMT, int kNT>
__device__ __forceinline__ void warp_operands(const MoeGemmParams& p, const MoeWorkItem& item,
                                              const int (&rows)[kMT], WarpOperands<kMT, kNT>& op) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint8_t* w = p.w + item.expert * p.w_expert_bytes;
  const uint8_t* s = kFp4 ? p.w_scale + item.expert * p.s_expert_bytes : nullptr;
  op.a_stride8 = int(8 * p.w_row_bytes);
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    if constexpr (kFp4) {
      const int64_t block = nvfp4_tile_block(rows[m], 0, p.k);
      op.a[m] = w + block * kNvfp4TileCodeBytes + nvfp4_lane_code_offset(lane);
      op.s[m] = s + block * kNvfp4TileScaleBytes + nvfp4_lane_scale_offset(lane);
    } else {
      op.a[m] = w + (rows[m] + g) * p.w_row_bytes + 64 * t;
      op.s[m] = nullptr;
    }
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

}  // namespace tetra::ops::cuda::moe_stream
