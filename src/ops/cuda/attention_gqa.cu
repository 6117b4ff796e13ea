// Paged causal GQA attention over a paged BF16 KV cache (sm_90a, mma.sync).
//
// Rows, not heads: the query rows of a work item are the (token, head) pairs of one sequence
// and one KV head, packed token-major (row = token_offset * group + head_in_group), so every
// K/V row brought to shared memory serves the whole GQA group, and a decode token of a group
// of 8 heads fills half of one m16n8k16 tile instead of one row of it.
//
// One kernel, two configurations (attention_mma_kernel, shapes in DecodeTile / PrefillTile),
// and a wgmma kernel for prefill of a BF16 cache at head dim 128 (attention_gqa_wgmma.cu):
// - Decode (a sequence's rows fit 16): the warps of a block share the 16 rows and split each
//   64-key tile between them, then merge their softmax states. The keys of a (sequence, KV
//   head) are also split over enough blocks to fill the GPU even for one sequence
//   (flash-decoding): each split leaves its (max, sum, unnormalized output) in the workspace
//   and combine_splits_kernel merges them.
// - Prefill: 8 warps a block own 128 rows and share each K/V tile (FlashAttention-2). Tiles
//   past the block's last position are never loaded, and a warp skips the tiles that are
//   masked for all of its rows. Few row tiles on long contexts are split over keys as well.
// K/V tiles stream through shared-memory stages with 16-byte cp.async, the block-table lookups
// one tile ahead of the copies; head dims that are a multiple of 8 are zero-padded to the
// tile's D (64, 128 or 256). An FP8 cache's stages hold its bytes: decode tiles run FP16 MMAs
// whose K and V fragments are converted from those bytes in registers (attention_fp8_layout.h),
// prefill tiles widen each tile to BF16 K and V tiles first. Everything else runs on
// attention_fallback_kernel: one warp per (token, head), f32 CUDA cores.
//
// The key range of a block is [0, max position of its rows + 1), read from `positions`:
// block table entries past what the positions need are never read, and seq_lens is unused.
#include "ops/cuda/attention_gqa.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/attention_fp8_layout.h"
#include "ops/cuda/attention_gqa_internal.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_sync.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxHeadDim = 256;

using gqa::KernelArgs;
using gqa::slot_of;

// A block's tiles: kBlockN keys at a time, kStages K/V tiles in shared memory (kStages - 1
// in flight while one is computed). Prefill (kSplitKeys false): each warp owns 16 query rows
// and scores every key of the tile. Decode (kSplitKeys true): the warps share one 16-row tile
// and each scores its own kBlockN / kWarps keys of the tile, then the warps' softmax states
// are merged: more warps per SM to hide the latency of a stream that no other work covers.
// kFp8: the stages hold the cache's E4M3 rows (D bytes apart). Decode tiles read their MMA
// fragments from them (kFp8Fragments: FP16 MMAs, Q stored as FP16); prefill tiles widen each
// into one BF16 K tile and one V tile (the layout of a BF16 stage) before it is computed.
template <int D, int kWarps, int kBlockN, int kStages, bool kSplitKeys, bool kFp8 = false>
struct TileShape {
  static constexpr int kD = D, kWarpCount = kWarps, kKeys = kBlockN, kStageCount = kStages;
  static constexpr bool kWarpsSplitKeys = kSplitKeys, kFp8Cache = kFp8;
  static constexpr bool kFp8Fragments = kFp8 && kSplitKeys, kFp8Widened = kFp8 && !kSplitKeys;
  static constexpr int kRows = kSplitKeys ? 16 : 16 * kWarps;
  static constexpr int kWarpKeys = kSplitKeys ? kBlockN / kWarps : kBlockN;  // keys a warp scores
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  // Rows of every tile are D + 8 elements apart: the 16-byte skew puts the 8 rows one
  // ldmatrix reads in 8 different bank groups (a stride of 128, 256 or 512 bytes would put
  // them all in one).
  static constexpr int kStride = D + 8;
  static constexpr int kQBytes = kRows * kStride * 2;
  static constexpr int kKvBytes = kBlockN * kStride * 2;  // one K or V tile
  static constexpr int kStride8 = D;  // bytes between FP8 rows of a stage: no skew
  static constexpr int kKv8Bytes = kBlockN * kStride8;    // one FP8 K or V tile
  // The stages follow Q, except that a widened FP8 tile's BF16 K and V tiles come between.
  static constexpr int kStage0Offset = kQBytes + (kFp8Widened ? 2 * kKvBytes : 0);
  static constexpr int kStageBytes = 2 * (kFp8 ? kKv8Bytes : kKvBytes);  // K then V
  static constexpr int kSlotsOffset = kStage0Offset + kStages * kStageBytes;
  // FP8 fragments: each row's softmax scale (Q's FP16 scaling folded in) after the slots.
  static constexpr int kRowScaleOffset = kSlotsOffset + kStages * kBlockN * 4;
  static constexpr int kSmemBytes = kRowScaleOffset + (kFp8Fragments ? kRows * 4 : 0);
  static constexpr int kMergeRowFloats = D + 2;  // a row's O, then its m and l
  // Blocks an SM must hold at once; it caps the registers so that they are not what stops
  // the next block. Decode: as many as shared memory allows, up to 4 (1 KB of each block's
  // share is the system's), and up to 3 with FP8 fragments (D = 128 needs 158 registers; 128
  // spills). Prefill: 2 blocks of 8 warps at 128 registers; D = 256 keeps 128 accumulators a
  // thread and runs one block.
  static constexpr int kMinBlocks =
      kSplitKeys ? std::min(kFp8 ? 3 : 4, 227 * 1024 / (kSmemBytes + 1024)) : (D == 256 ? 1 : 2);
  static_assert(D % 16 == 0 && D <= kMaxHeadDim, "D is a multiple of the mma's K (and FP8 rows whole 16-byte chunks)");
  static_assert(kWarpKeys % 16 == 0 && kBlockN <= kThreads, "16-key k-steps; one thread finds each key's slot");
  static_assert(kStages >= 2, "one tile computed while the next lands");
  static_assert(kRows * kChunks % kThreads == 0 && kBlockN * kChunks % kThreads == 0,
                "every thread copies the same number of chunks");
  static_assert(!kSplitKeys || kWarps * 16 * kMergeRowFloats * 4 <= kSlotsOffset - kQBytes,
                "the merge fits in the K/V tiles");
};

// ---- the mma kernel ----

// One block's work: a tile of packed query rows of one (sequence, KV head), one key split.
struct RowTile {
  int seq, kv_head, split;
  int token_begin, n_rows, row0;  // rows [row0, row0 + kRows) of the sequence's n_rows
  int key_begin, key_end;         // keys of this split, already cut at the rows' last position
};

// The two rows (g and g + 8 of its warp's 16) whose scores and outputs a lane holds.
struct LaneRows {
  bool valid[2];
  int token[2], head[2], position[2];
  int key_limit[2];  // last key the row sees in this split; -1 for padding rows
};

__device__ __forceinline__ LaneRows lane_rows(const KernelArgs& a, const RowTile& w, int warp_row0, int lane) {
  LaneRows rows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = w.row0 + warp_row0 + lane / 4 + 8 * r;
    rows.valid[r] = row < w.n_rows;
    rows.token[r] = w.token_begin + row / a.group;
    rows.head[r] = w.kv_head * a.group + row % a.group;
    rows.position[r] = rows.valid[r] ? a.p.positions[rows.token[r]] : -1;
    rows.key_limit[r] = -1;
  }
  return rows;
}

// One warp's running softmax state for its 16 rows.
template <int D>
struct WarpState {
  float acc[D / 8][4];  // O: rows g, g + 8; columns 8n + 2t, 8n + 2t + 1
  float m[2];           // running max of the scores, log2 units (-inf before any key)
  float l[2];           // the running sum of p: this lane's share, the row's after finish_sums
};

template <class T>
__device__ __forceinline__ void load_q_tile(const KernelArgs& a, const RowTile& w, uint16_t* q_smem) {
  constexpr int kPerThread = T::kRows * T::kChunks / T::kThreads;
#pragma unroll 2
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = int(threadIdx.x) + i * T::kThreads, r = idx / T::kChunks, c = idx % T::kChunks;
    const int row = w.row0 + r;
    const bool valid = row < w.n_rows && 8 * c < a.p.d_k;
    const uint16_t* src = a.p.q;
    if (valid) {
      const int token = w.token_begin + row / a.group, head = w.kv_head * a.group + row % a.group;
      src += (int64_t(token) * a.p.n_heads + head) * a.p.d_k + 8 * c;
    }
    cp_async_16(smem_addr(q_smem + r * T::kStride + 8 * c), src, valid);
  }
}

// The cache slot of `key`, or -1 past the split's keys (their block-table entries may be
// garbage and are never read).
__device__ __forceinline__ int slot_or_none(const KernelArgs& a, const RowTile& w, int key) {
  return key < w.key_end ? slot_of(a, w.seq, key) : -1;
}

// Copies the K and V rows of a tile's slots (found earlier, in shared memory); rows of slot -1
// and dims past d_k / d_v are zero-filled. Called by the whole block.
template <class T>
__device__ __forceinline__ void copy_kv_tile(const KernelArgs& a, const RowTile& w, const int32_t* slots,
                                             uint8_t* k_stage, uint8_t* v_stage) {
  if constexpr (T::kFp8Cache) {
    // 16 values a copy; the chunks may not divide over the threads.
    constexpr int kRowChunks = T::kD / 16, kChunks = T::kKeys * kRowChunks, kPerThread = (kChunks + T::kThreads - 1) / T::kThreads;
#pragma unroll 2
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = int(threadIdx.x) + i * T::kThreads, r = idx / kRowChunks, c = idx % kRowChunks;
      if (idx >= kChunks) break;
      const int slot = slots[r];
      const int64_t cache_row = int64_t(slot) * a.p.n_kv_heads + w.kv_head;
      const bool k_valid = slot >= 0 && 16 * c < a.p.d_k, v_valid = slot >= 0 && 16 * c < a.p.d_v;
      const uint8_t* k_cache = static_cast<const uint8_t*>(a.p.k_cache);
      const uint8_t* v_cache = static_cast<const uint8_t*>(a.p.v_cache);
      // Decode tiles swizzle their rows' chunks for the fragment loads; widen_tile reads rows
      // in place.
      const int k_dst = T::kFp8Fragments ? fp8_tile::k_offset(T::kD, r, 16 * c) : r * T::kStride8 + 16 * c;
      const int v_dst = T::kFp8Fragments ? fp8_tile::v_offset(T::kD, r, 16 * c) : r * T::kStride8 + 16 * c;
      cp_async_16(smem_addr(k_stage + k_dst), k_valid ? k_cache + cache_row * a.p.d_k + 16 * c : k_cache, k_valid);
      cp_async_16(smem_addr(v_stage + v_dst), v_valid ? v_cache + cache_row * a.p.d_v + 16 * c : v_cache, v_valid);
    }
    return;
  }
  uint16_t* k_smem = reinterpret_cast<uint16_t*>(k_stage);
  uint16_t* v_smem = reinterpret_cast<uint16_t*>(v_stage);
  const uint16_t* k_cache = static_cast<const uint16_t*>(a.p.k_cache);
  const uint16_t* v_cache = static_cast<const uint16_t*>(a.p.v_cache);
  constexpr int kPerThread = T::kKeys * T::kChunks / T::kThreads;
  // Two rows' addresses at a time: a full unroll would hold every 64-bit source address of
  // the tile in registers next to O.
#pragma unroll 2
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = int(threadIdx.x) + i * T::kThreads, r = idx / T::kChunks, c = idx % T::kChunks;
    const int slot = slots[r];
    const int64_t cache_row = int64_t(slot) * a.p.n_kv_heads + w.kv_head;
    const bool k_valid = slot >= 0 && 8 * c < a.p.d_k, v_valid = slot >= 0 && 8 * c < a.p.d_v;
    const uint16_t* k_src = k_valid ? k_cache + cache_row * a.p.d_k + 8 * c : k_cache;
    const uint16_t* v_src = v_valid ? v_cache + cache_row * a.p.d_v + 8 * c : v_cache;
    cp_async_16(smem_addr(k_smem + r * T::kStride + 8 * c), k_src, k_valid);
    cp_async_16(smem_addr(v_smem + r * T::kStride + 8 * c), v_src, v_valid);
  }
}

// A prefill tile's FP8 stage, K and V, widened to the BF16 tiles the MMAs read (exact: E4M3
// has 3 mantissa bits) by the whole block; the zero-filled rows and dims stay zero.
template <class T>
__device__ __forceinline__ void widen_tile(const uint8_t* k_stage, const uint8_t* v_stage, uint16_t* k_smem,
                                           uint16_t* v_smem) {
  constexpr int kRowChunks = T::kD / 16, kChunks = T::kKeys * kRowChunks;
  constexpr int kPerThread = (kChunks + T::kThreads - 1) / T::kThreads;
  const auto widen = [](const uint8_t* src, uint16_t* dst) {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    uint32_t out[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t h = e4m3x2_to_f16x2(word(v, i / 2) >> (16 * (i & 1)));
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      out[i] = pack_bf16x2(f.x, f.y);
    }
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
  };
#pragma unroll 2
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = int(threadIdx.x) + i * T::kThreads, r = idx / kRowChunks, c = idx % kRowChunks;
    if (idx >= kChunks) break;
    widen(k_stage + r * T::kStride8 + 16 * c, k_smem + r * T::kStride + 16 * c);
    widen(v_stage + r * T::kStride8 + 16 * c, v_smem + r * T::kStride + 16 * c);
  }
}

// The warp's 16 query rows as mma A operands, read from shared memory for every key tile (an
// ldmatrix a 16-dim k-step): keeping them in registers would cost 32 (D = 128) that the
// residency targets above cannot spare.
template <class T>
struct QOperand {
  uint32_t addr;  // this lane's ldmatrix row address for k-step 0

  __device__ __forceinline__ QOperand(const uint16_t* q_smem, int warp_row0, int lane)
      : addr(smem_addr(q_smem + (warp_row0 + lane % 16) * T::kStride + (lane / 16) * 8)) {}
  __device__ __forceinline__ void get(int kk, uint32_t (&a)[4]) const { ldmatrix_x4(a, addr + kk * 32); }
};

// An FP8 decode tile's Q rows as this thread loaded them: kThreads / 16 threads a row, 8 dims
// a 16-byte chunk. Loaded before the tile's first K/V copies are issued, stored after them.
template <class T>
struct QRowsBf16 {
  static constexpr int kThreadsPerRow = T::kThreads / T::kRows;
  static constexpr int kChunks = T::kChunks / kThreadsPerRow;  // this thread's chunks of its row
  static_assert(T::kThreads % T::kRows == 0 && 32 % kThreadsPerRow == 0 && T::kChunks % kThreadsPerRow == 0,
                "a row's threads are lanes of one warp and share its chunks evenly");
  uint4 v[kChunks];  // chunk tid % kThreadsPerRow + i * kThreadsPerRow of row tid / kThreadsPerRow
};

template <class T>
__device__ __forceinline__ QRowsBf16<T> load_q_rows(const KernelArgs& a, const RowTile& w) {
  using Q = QRowsBf16<T>;
  const int tid = int(threadIdx.x), row = w.row0 + tid / Q::kThreadsPerRow;
  const uint16_t* src = nullptr;
  if (row < w.n_rows) {
    const int token = w.token_begin + row / a.group, head = w.kv_head * a.group + row % a.group;
    src = a.p.q + (int64_t(token) * a.p.n_heads + head) * a.p.d_k;
  }
  Q q;
#pragma unroll
  for (int i = 0; i < Q::kChunks; ++i) {
    const int c = tid % Q::kThreadsPerRow + i * Q::kThreadsPerRow;
    q.v[i] = src && 8 * c < a.p.d_k ? __ldg(reinterpret_cast<const uint4*>(src + 8 * c)) : make_uint4(0, 0, 0, 0);
  }
  return q;
}

// Stores the rows as FP16 in the column order of warp_scores_fp8 (fp8_tile::q_column), each row
// scaled by the power of two 2^e that puts its largest |q| in [2^14, 2^15): exact, since a BF16
// value's 8 significant bits fit FP16's 11, and far from FP16's overflow at 65,504. The row's
// softmax scale takes the 2^-e back.
template <class T>
__device__ __forceinline__ void store_q_rows(const KernelArgs& a, const QRowsBf16<T>& q, uint16_t* q_smem,
                                             float* row_scale_log2) {
  using Q = QRowsBf16<T>;
  const int tid = int(threadIdx.x), r = tid / Q::kThreadsPerRow;
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < Q::kChunks; ++i)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t pair = word(q.v[i], w);
      m = fmaxf(m, fmaxf(fabsf(bf16_to_float(uint16_t(pair))), fabsf(bf16_to_float(uint16_t(pair >> 16)))));
    }
#pragma unroll
  for (int o = Q::kThreadsPerRow / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  // e = 14 - floor(log2 m), capped where 2^-e would leave the normal floats (a row of zeros: 0).
  const int e = m == 0.0f ? 0 : min(14 - (int(__float_as_uint(m) >> 23) - 127), 126);
  const float up = __uint_as_float(uint32_t(127 + e) << 23);
  if (tid % Q::kThreadsPerRow == 0) row_scale_log2[r] = a.scale_log2 * __uint_as_float(uint32_t(127 - e) << 23);
#pragma unroll
  for (int i = 0; i < Q::kChunks; ++i) {
    const int c = tid % Q::kThreadsPerRow + i * Q::kThreadsPerRow;
#pragma unroll
    for (int w = 0; w < 4; ++w) {  // dims 8c + 2w, 8c + 2w + 1 stay adjacent under q_column
      const uint32_t pair = word(q.v[i], w);
      *reinterpret_cast<uint32_t*>(q_smem + r * T::kStride + fp8_tile::q_column(8 * c + 2 * w)) =
          pack_f16x2(bf16_to_float(uint16_t(pair)) * up, bf16_to_float(uint16_t(pair >> 16)) * up);
    }
  }
}

// s = Q K^T for the warp's 16 rows and the tile's keys (raw dot products).
template <class T>
__device__ __forceinline__ void warp_scores(const KernelArgs& a, const QOperand<T>& q,
                                            const uint16_t* k_smem, int lane,
                                            float (&s)[T::kWarpKeys / 8][4]) {
#pragma unroll
  for (int n = 0; n < T::kWarpKeys / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
  // ldmatrix x4 of K rows: matrices (keys 0-7, dims 0-7), (0-7, 8-15), (8-15, 0-7), (8-15,
  // 8-15) are the B operands (b0, b1) of two 8-key n-tiles.
  const uint32_t k_addr =
      smem_addr(k_smem + ((lane / 16) * 8 + lane % 8) * T::kStride + ((lane / 8) % 2) * 8);
#pragma unroll
  for (int kk = 0; kk < T::kD / 16; ++kk) {
    if (16 * kk >= a.p.d_k) break;  // zero padding: nothing to add
    uint32_t qa[4];
    q.get(kk, qa);
#pragma unroll
    for (int np = 0; np < T::kWarpKeys / 16; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k_addr + np * 16 * T::kStride * 2 + kk * 32);
      mma_bf16_16x8x16(s[2 * np], qa, kb[0], kb[1]);
      mma_bf16_16x8x16(s[2 * np + 1], qa, kb[2], kb[3]);
    }
  }
}

// warp_scores for an FP8 tile (kFp8Fragments): the K fragments are converted from the stage's
// bytes in registers, Q is FP16 in q_column order. key_row0: the warp's first key row.
template <class T>
__device__ __forceinline__ void warp_scores_fp8(const KernelArgs& a, const QOperand<T>& q, const uint8_t* k_stage,
                                                int key_row0, int lane, float (&s)[T::kWarpKeys / 8][4]) {
#pragma unroll
  for (int n = 0; n < T::kWarpKeys / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < T::kD / 64; ++h) {  // 64 dims: one 16-byte load a key row, four k-steps
    if (64 * h >= a.p.d_k) break;
    uint4 k[T::kWarpKeys / 8];
#pragma unroll
    for (int n = 0; n < T::kWarpKeys / 8; ++n)
      k[n] = *reinterpret_cast<const uint4*>(k_stage + fp8_tile::k_offset(T::kD, key_row0 + 8 * n + g, 64 * h + 16 * t));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t qa[4];
      q.get(4 * h + j, qa);
#pragma unroll
      for (int n = 0; n < T::kWarpKeys / 8; ++n) {
        const uint32_t pairs = word(k[n], j);  // fp8_tile::k_dim(4h + j, t, 0 and 1)
        mma_f16_16x8x16(s[n], qa, e4m3x2_to_f16x2(pairs & 0xffffu), e4m3x2_to_f16x2(pairs >> 16));
      }
    }
  }
}

// Turns the tile's scores into p = exp2(score - running max) in place, rescales the running
// sum and O by the change of the max. `masked`: some key of the tile is past some row's limit.
// scale_log2: the lane's two rows' softmax scales.
template <class T>
__device__ __forceinline__ void online_softmax(const LaneRows& rows, const float (&scale_log2)[2], int key0,
                                               bool masked, int lane, float (&s)[T::kWarpKeys / 8][4],
                                               WarpState<T::kD>& st) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < T::kWarpKeys / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float x = s[n][i] * scale_log2[i / 2];
      if (masked && key0 + 8 * n + 2 * (lane % 4) + (i & 1) > rows.key_limit[i / 2]) x = -INFINITY;
      s[n][i] = x;
      tile_max[i / 2] = fmaxf(tile_max[i / 2], x);
    }
  float base[2], alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(st.m[r], quad_max(tile_max[r]));
    // A row with no key yet keeps m = -inf; subtracting 0 instead keeps exp2 away from
    // -inf - -inf = NaN (its p are all exp2(-inf) = 0).
    base[r] = m_new == -INFINITY ? 0.0f : m_new;
    // Such a row's O and sum are still 0: it needs no rescale (alpha 1, not exp2(-inf) = 0).
    alpha[r] = m_new == -INFINITY ? 1.0f : exp2_approx(st.m[r] - base[r]);
    st.m[r] = m_new;
  }
  float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < T::kWarpKeys / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[n][i] = exp2_approx(s[n][i] - base[i / 2]);
      tile_sum[i / 2] += s[n][i];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = st.l[r] * alpha[r] + tile_sum[r];
  // Once a row has seen a few tiles its max rarely moves: O's rescale (D / 2 multiplies a lane)
  // is skipped when it moved for no row of the warp. Exact: the skipped factors are all 1.
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < T::kD / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) st.acc[n][i] *= alpha[i / 2];
  }
}

// O += P V. The score accumulators of n-tiles 2kk, 2kk + 1 are exactly the A operand of
// k-step kk (rows g, g + 8; keys 2t, 2t + 1, 2t + 8, 2t + 9), so P never leaves registers.
template <class T>
__device__ __forceinline__ void accumulate_pv(const KernelArgs& a, const float (&p)[T::kWarpKeys / 8][4],
                                              const uint16_t* v_smem, int lane,
                                              WarpState<T::kD>& st) {
  // ldmatrix x4 .trans of V rows: matrices (keys 0-7, dims 0-7), (8-15, 0-7), (0-7, 8-15),
  // (8-15, 8-15) are the B operands (b0, b1) of two 8-dim n-tiles.
  const uint32_t v_addr =
      smem_addr(v_smem + (((lane / 8) % 2) * 8 + lane % 8) * T::kStride + (lane / 16) * 8);
#pragma unroll
  for (int kk = 0; kk < T::kWarpKeys / 16; ++kk) {
    const uint32_t pa[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]),
                            pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                            pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < T::kD / 16; ++np) {
      if (16 * np >= a.p.d_v) break;  // padded output dims are never stored
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_addr + kk * 16 * T::kStride * 2 + np * 32);
      mma_bf16_16x8x16(st.acc[2 * np], pa, vb[0], vb[1]);
      mma_bf16_16x8x16(st.acc[2 * np + 1], pa, vb[2], vb[3]);
    }
  }
}

// accumulate_pv for an FP8 tile: n-tile 4q + j of O holds dims fp8_tile::v_dim(4q + j, .), byte
// j of the 4 bytes a lane loads from each of its four key rows of the k-step.
template <class T>
__device__ __forceinline__ void accumulate_pv_fp8(const KernelArgs& a, const float (&p)[T::kWarpKeys / 8][4],
                                                  const uint8_t* v_stage, int key_row0, int lane,
                                                  WarpState<T::kD>& st) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int kk = 0; kk < T::kWarpKeys / 16; ++kk) {
    const uint32_t pa[4] = {pack_f16x2(p[2 * kk][0], p[2 * kk][1]), pack_f16x2(p[2 * kk][2], p[2 * kk][3]),
                            pack_f16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_f16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    const int row = key_row0 + 16 * kk + 2 * t;  // the fragment's keys 2t, 2t + 1, 2t + 8, 2t + 9
#pragma unroll
    for (int q = 0; q < T::kD / 32; ++q) {
      if (32 * q >= a.p.d_v) break;  // padded output dims are never stored
      const auto v_word = [&](int r) {
        return *reinterpret_cast<const uint32_t*>(v_stage + fp8_tile::v_offset(T::kD, r, 32 * q + 4 * g));
      };
      const uint32_t w0 = v_word(row), w1 = v_word(row + 1), w8 = v_word(row + 8), w9 = v_word(row + 9);
      // Byte j of keys (2t, 2t + 1) side by side, and of (2t + 8, 2t + 9): b0 and b1 of n-tile 4q + j.
      const uint32_t b0_01 = __byte_perm(w0, w1, 0x5140), b0_23 = __byte_perm(w0, w1, 0x7362);
      const uint32_t b1_01 = __byte_perm(w8, w9, 0x5140), b1_23 = __byte_perm(w8, w9, 0x7362);
      mma_f16_16x8x16(st.acc[4 * q], pa, e4m3x2_to_f16x2(b0_01 & 0xffffu), e4m3x2_to_f16x2(b1_01 & 0xffffu));
      mma_f16_16x8x16(st.acc[4 * q + 1], pa, e4m3x2_to_f16x2(b0_01 >> 16), e4m3x2_to_f16x2(b1_01 >> 16));
      mma_f16_16x8x16(st.acc[4 * q + 2], pa, e4m3x2_to_f16x2(b0_23 & 0xffffu), e4m3x2_to_f16x2(b1_23 & 0xffffu));
      mma_f16_16x8x16(st.acc[4 * q + 3], pa, e4m3x2_to_f16x2(b0_23 >> 16), e4m3x2_to_f16x2(b1_23 >> 16));
    }
  }
}

// The lane's rows of O: normalized to `out` in BF16, or (split runs) unnormalized to the
// workspace with their max and sum.
template <class T>
__device__ __forceinline__ void store_rows(const KernelArgs& a, const RowTile& w, const LaneRows& rows,
                                           int lane, WarpState<T::kD>& st) {
  const int t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = st.l[r];
    if (!rows.valid[r]) continue;
    const int64_t out_row = int64_t(rows.token[r]) * a.p.n_heads + rows.head[r];
    if constexpr (T::kFp8Fragments) {
      // The lane holds dims 32q + 8t .. + 7 of each 32-dim group q (fp8_tile::out_dim).
      const bool split = a.n_splits > 1;
      const float factor = split ? a.v_scale : l > 0.0f ? a.v_scale / l : 0.0f;
#pragma unroll
      for (int q = 0; q < T::kD / 32; ++q) {
        const int dim0 = 32 * q + 8 * t;
        if (dim0 >= a.p.d_v) continue;
        float o[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = st.acc[4 * q + j][2 * r] * factor, o[4 + j] = st.acc[4 * q + j][2 * r + 1] * factor;
        if (split) {
          float4* dst = reinterpret_cast<float4*>(a.partial_acc + (out_row * a.n_splits + w.split) * a.p.d_v + dim0);
          dst[0] = make_float4(o[0], o[1], o[2], o[3]);
          dst[1] = make_float4(o[4], o[5], o[6], o[7]);
        } else {
          *reinterpret_cast<uint4*>(a.p.out + out_row * a.p.d_v + dim0) =
              make_uint4(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]), pack_bf16x2(o[4], o[5]), pack_bf16x2(o[6], o[7]));
        }
      }
      if (split && t == 0) a.partial_ml[out_row * a.n_splits + w.split] = make_float2(st.m[r], l);
      continue;
    }
    if (a.n_splits > 1) {
      const int64_t part = out_row * a.n_splits + w.split;
      float* dst = a.partial_acc + part * a.p.d_v;
#pragma unroll
      for (int n = 0; n < T::kD / 8; ++n) {
        const int col = 8 * n + 2 * t;
        if (col < a.p.d_v)
          *reinterpret_cast<float2*>(dst + col) =
              make_float2(st.acc[n][2 * r] * a.v_scale, st.acc[n][2 * r + 1] * a.v_scale);
      }
      if (t == 0) a.partial_ml[part] = make_float2(st.m[r], l);
    } else {
      const float inv = l > 0.0f ? a.v_scale / l : 0.0f;  // no key at all (a negative position): 0
      uint16_t* dst = a.p.out + out_row * a.p.d_v;
#pragma unroll
      for (int n = 0; n < T::kD / 8; ++n) {
        const int col = 8 * n + 2 * t;
        if (col < a.p.d_v)
          *reinterpret_cast<uint32_t*>(dst + col) =
              pack_bf16x2(st.acc[n][2 * r] * inv, st.acc[n][2 * r + 1] * inv);
      }
    }
  }
}

// Each lane's share of a row's sum becomes the row's sum, in all four lanes of the quad.
template <int D>
__device__ __forceinline__ void finish_sums(WarpState<D>& st) {
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = quad_sum(st.l[r]);
}

// Decode blocks: the warps scored disjoint keys of the same 16 rows. Warp 0 merges their
// states (the same rescaling as combine_splits_kernel) through the K/V stages, which are free
// once every warp is past its last tile. Called by the whole block.
template <class T>
__device__ __forceinline__ void merge_warps(uint8_t* smem, int warp, int lane, WarpState<T::kD>& st) {
  constexpr int kRowFloats = T::kMergeRowFloats;
  float* merge = reinterpret_cast<float*>(smem + T::kQBytes);  // [warp][16 rows][kRowFloats]
  const int g = lane / 4, t = lane % 4;
  __syncthreads();
  if (warp > 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* dst = merge + (warp * 16 + g + 8 * r) * kRowFloats;
#pragma unroll
      for (int n = 0; n < T::kD / 8; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n + 2 * t) = make_float2(st.acc[n][2 * r], st.acc[n][2 * r + 1]);
      if (t == 0) dst[T::kD] = st.m[r], dst[T::kD + 1] = st.l[r];
    }
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float* row = merge + (g + 8 * r) * kRowFloats;
    float m = st.m[r];
#pragma unroll
    for (int w = 1; w < T::kWarpCount; ++w) m = fmaxf(m, row[w * 16 * kRowFloats + T::kD]);
    const float base = m == -INFINITY ? 0.0f : m;  // no key in any warp: everything stays 0
    const float own = exp2_approx(st.m[r] - base);
    float l = st.l[r] * own;
#pragma unroll
    for (int n = 0; n < T::kD / 8; ++n) st.acc[n][2 * r] *= own, st.acc[n][2 * r + 1] *= own;
#pragma unroll 1  // one warp's O at a time: all of them at once would not fit in registers
    for (int w = 1; w < T::kWarpCount; ++w) {
      const float* other = row + w * 16 * kRowFloats;
      const float weight = exp2_approx(other[T::kD] - base);
      l += weight * other[T::kD + 1];
#pragma unroll
      for (int n = 0; n < T::kD / 8; ++n) {
        const float2 o = *reinterpret_cast<const float2*>(other + 8 * n + 2 * t);
        st.acc[n][2 * r] += weight * o.x;
        st.acc[n][2 * r + 1] += weight * o.y;
      }
    }
    st.m[r] = m;
    st.l[r] = l;
  }
}

// Cuts the split's keys at the block's last position and gives each lane row its key limit.
template <class T>
__device__ __forceinline__ void key_range(const KernelArgs& a, RowTile& w, LaneRows& rows, int warp,
                                          int lane) {
  __shared__ int warp_max_position[T::kWarpCount];
  const int wmax = __reduce_max_sync(0xffffffffu, max(rows.position[0], rows.position[1]));
  if (lane == 0) warp_max_position[warp] = wmax;
  __syncthreads();
  int max_position = -1;
#pragma unroll
  for (int i = 0; i < T::kWarpCount; ++i) max_position = max(max_position, warp_max_position[i]);
  const int kv_end = min(max_position + 1, a.key_cap);
  // Decode splits this sequence's own keys evenly over the splits, in whole tiles: however
  // long the sequence, every split has work until each holds a single tile. (The split count
  // comes from the step's capacity, so a graph planned once serves every length.)
  const int per_split = T::kWarpsSplitKeys
                            ? max(T::kKeys, (kv_end + a.n_splits * T::kKeys - 1) / (a.n_splits * T::kKeys) * T::kKeys)
                            : a.keys_per_split;
  w.key_begin = w.split * per_split;
  w.key_end = w.split == a.n_splits - 1 ? kv_end : min(kv_end, w.key_begin + per_split);
#pragma unroll
  for (int r = 0; r < 2; ++r) rows.key_limit[r] = rows.valid[r] ? min(rows.position[r], w.key_end - 1) : -1;
}

// The pipeline, with S = kStages: tiles 0 .. S - 2 are in flight before the loop; iteration
// `it` waits for tile it, refills the stage that tile it - 1 used with tile it + S - 1, and
// computes tile it. One cp.async group is committed per tile slot (empty past the end), so
// "all but S - 2 groups done" always means "tile it landed". The block-table lookups run one
// tile ahead of the copies that use them: thread k < kKeys loads the slot of key k of tile
// it + S before computing tile it and stores it after, so the load's latency hides behind
// the mma work, and the barrier at the top of the next iteration publishes it.
template <class T>
__device__ __forceinline__ void attend_row_tile(const KernelArgs& a, uint8_t* smem, RowTile w) {
  constexpr int S = T::kStageCount;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  // Stage s: K tile, V tile and key slots (computed from s: a pointer array indexed by a
  // run-time stage would live in local memory). The MMAs read a stage itself, or the BF16
  // tiles a prefill FP8 stage is widened into.
  uint16_t* q_smem = reinterpret_cast<uint16_t*>(smem);
  float* row_scale_log2 = reinterpret_cast<float*>(smem + T::kRowScaleOffset);  // FP8 fragments only
  const auto k_stage = [&](int s) { return smem + T::kStage0Offset + s * T::kStageBytes; };
  const auto v_stage = [&](int s) { return k_stage(s) + T::kStageBytes / 2; };
  const auto k_smem = [&](int s) {
    return reinterpret_cast<uint16_t*>(T::kFp8Widened ? smem + T::kQBytes : k_stage(s));
  };
  const auto v_smem = [&](int s) {
    return reinterpret_cast<uint16_t*>(T::kFp8Widened ? smem + T::kQBytes + T::kKvBytes : v_stage(s));
  };
  const auto slots = [&](int s) { return reinterpret_cast<int32_t*>(smem + T::kSlotsOffset) + s * T::kKeys; };

  // Prefill warps own rows 16 * warp ..; decode warps share rows 0 .. 15 and own keys
  // warp_key0 .. warp_key0 + kWarpKeys - 1 of every tile.
  const int warp_row0 = T::kWarpsSplitKeys ? 0 : 16 * warp;
  const int warp_key0 = T::kWarpsSplitKeys ? warp * T::kWarpKeys : 0;
  LaneRows rows = lane_rows(a, w, warp_row0, lane);
  key_range<T>(a, w, rows, warp, lane);
  // Warp-uniform: the last key any row of the warp sees, and the first key some row does not.
  const int warp_last_key = __reduce_max_sync(0xffffffffu, max(rows.key_limit[0], rows.key_limit[1]));
  const int warp_first_masked =
      __reduce_min_sync(0xffffffffu, min(rows.key_limit[0], rows.key_limit[1])) + 1;

  WarpState<T::kD> st;
#pragma unroll
  for (int n = 0; n < T::kD / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.acc[n][i] = 0.0f;
#pragma unroll
  for (int r = 0; r < 2; ++r) st.m[r] = -INFINITY, st.l[r] = 0.0f;

  const int n_tiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + T::kKeys - 1) / T::kKeys : 0;
  if (n_tiles > 0) {
    const auto tile_key = [&](int tile) { return w.key_begin + tile * T::kKeys + tid; };
    if (tid < T::kKeys) {
#pragma unroll
      for (int j = 0; j < S; ++j) slots(j)[tid] = slot_or_none(a, w, tile_key(j));
    }
    // FP8 fragments: Q's loads are in flight across the barrier and the first copies, and its
    // FP16 rows are published by the loop's first barrier. Otherwise Q is copied with tile 0.
    QRowsBf16<T> q_rows;
    if constexpr (T::kFp8Fragments) q_rows = load_q_rows<T>(a, w);
    else load_q_tile<T>(a, w, q_smem);
    __syncthreads();  // the slots of tiles 0 .. S - 1
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
      if (j < n_tiles) copy_kv_tile<T>(a, w, slots(j), k_stage(j), v_stage(j));
      cp_async_commit();  // Q joins tile 0's group
    }
    if constexpr (T::kFp8Fragments) store_q_rows<T>(a, q_rows, q_smem, row_scale_log2);
    const QOperand<T> q(q_smem, warp_row0, lane);
    for (int it = 0; it < n_tiles; ++it) {
      const int stage = it % S, next = it + S - 1;
      cp_async_wait<S - 2>();
      // Every thread's copies of tile it landed, every warp is done with tile it - 1 (whose
      // stage is refilled next), and the slots stored last iteration are visible.
      __syncthreads();
      if (next < n_tiles) copy_kv_tile<T>(a, w, slots(next % S), k_stage(next % S), v_stage(next % S));
      cp_async_commit();
      const int ahead_slot = tid < T::kKeys ? slot_or_none(a, w, tile_key(next + 1)) : -1;
      if constexpr (T::kFp8Widened) {
        // The BF16 tiles are free: every warp is past tile it - 1 (the barrier above).
        widen_tile<T>(k_stage(stage), v_stage(stage), k_smem(stage), v_smem(stage));
        __syncthreads();
      }
      const int key0 = w.key_begin + it * T::kKeys + warp_key0;
      if (key0 <= warp_last_key) {
        const bool masked = key0 + T::kWarpKeys > warp_first_masked;
        float s[T::kWarpKeys / 8][4];
        if constexpr (T::kFp8Fragments) {
          const float scale[2] = {row_scale_log2[lane / 4], row_scale_log2[lane / 4 + 8]};
          warp_scores_fp8<T>(a, q, k_stage(stage), warp_key0, lane, s);
          online_softmax<T>(rows, scale, key0, masked, lane, s, st);
          accumulate_pv_fp8<T>(a, s, v_stage(stage), warp_key0, lane, st);
        } else {
          const float scale[2] = {a.scale_log2, a.scale_log2};
          warp_scores<T>(a, q, k_smem(stage) + warp_key0 * T::kStride, lane, s);
          online_softmax<T>(rows, scale, key0, masked, lane, s, st);
          accumulate_pv<T>(a, s, v_smem(stage) + warp_key0 * T::kStride, lane, st);
        }
      }
      // Tile it's slots were used when it was copied: the buffer takes tile it + S.
      if (tid < T::kKeys) slots(stage)[tid] = ahead_slot;
    }
  }
  finish_sums(st);
  if constexpr (T::kWarpsSplitKeys && T::kWarpCount > 1) {
    merge_warps<T>(smem, warp, lane, st);
    if (warp != 0) return;
  }
  store_rows<T>(a, w, rows, lane, st);
}

// grid: (row tiles x splits, KV heads, sequences). Row tiles beyond max_query_len are still
// covered (the loop strides over them), so a low max_query_len costs speed, not results.
template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) attention_mma_kernel(const KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ __align__(128) uint8_t smem[];
  RowTile w;
  w.seq = int(blockIdx.z);
  w.kv_head = int(blockIdx.y);
  w.split = int(blockIdx.x) % a.n_splits;
  w.token_begin = a.p.seq_starts[w.seq];
  w.n_rows = (a.p.seq_starts[w.seq + 1] - w.token_begin) * a.group;
  const int tile_stride = int(gridDim.x) / a.n_splits;
  for (int tile = int(blockIdx.x) / a.n_splits; tile * T::kRows < w.n_rows; tile += tile_stride) {
    w.row0 = tile * T::kRows;
    attend_row_tile<T>(a, smem, w);
    __syncthreads();  // shared memory is reused by the next row tile
  }
}

// ---- split combine ----

constexpr int kCombineWarps = 4;
constexpr int kCombineDims = kMaxHeadDim / 32;  // output dims per lane

// One block per (token, head): out = sum_i 2^(m_i - M) acc_i / sum_i 2^(m_i - M) l_i over
// the splits i with a key (m_i > -inf). Threads take every 128th split for the max and
// warps every 4th for the sums, so no pass is a chain of dependent loads over all splits.
__global__ void __launch_bounds__(kCombineWarps * 32) combine_splits_kernel(const KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t out_row = blockIdx.x;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, d_v = a.p.d_v;
  const float2* ml = a.partial_ml + out_row * a.n_splits;
  __shared__ float warp_max[kCombineWarps];
  float m_max = -INFINITY;
  for (int i = int(threadIdx.x); i < a.n_splits; i += kCombineWarps * 32) m_max = fmaxf(m_max, ml[i].x);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, o));
  if (lane == 0) warp_max[warp] = m_max;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) m_max = fmaxf(m_max, warp_max[w]);

  float l_sum = 0.0f, acc[kCombineDims] = {};
#pragma unroll 4
  for (int i = warp; i < a.n_splits; i += kCombineWarps) {
    const float2 v = ml[i];
    if (v.x == -INFINITY) continue;  // no key in this split: its acc is zeros anyway
    const float weight = exp2_approx(v.x - m_max);
    l_sum += weight * v.y;
    const float* part = a.partial_acc + (out_row * a.n_splits + i) * d_v;
#pragma unroll
    for (int j = 0; j < kCombineDims; ++j)
      if (lane + 32 * j < d_v) acc[j] += weight * part[lane + 32 * j];
  }
  __shared__ float warp_acc[kCombineWarps][kMaxHeadDim];
  __shared__ float warp_l[kCombineWarps];
#pragma unroll
  for (int j = 0; j < kCombineDims; ++j) warp_acc[warp][lane + 32 * j] = acc[j];
  if (lane == 0) warp_l[warp] = l_sum;
  __syncthreads();
  float l_total = 0.0f;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) l_total += warp_l[w];
  const float inv = l_total > 0.0f ? 1.0f / l_total : 0.0f;
  for (int d = int(threadIdx.x); d < d_v; d += kCombineWarps * 32) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) o += warp_acc[w][d];
    a.p.out[out_row * d_v + d] = to_bf16(o * inv);
  }
}

// ---- fallback ----

constexpr int kFallbackWarps = 4;
constexpr int kFallbackDims = kMaxHeadDim / 32;  // head dims per lane

__device__ __forceinline__ int sequence_of_token(const PagedAttentionParams& p, int token) {
  int lo = 0, hi = p.n_seqs - 1;  // the last sequence starting at or before `token`
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.seq_starts[mid] <= token) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One warp per (token, head), keys one at a time with an online softmax: any head dims, any
// alignment, no shared memory. Lane l holds dims l, l + 32, ...
__global__ void __launch_bounds__(kFallbackWarps * 32) attention_fallback_kernel(const KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const PagedAttentionParams& p = a.p;
  const int64_t out_row = int64_t(blockIdx.x) * kFallbackWarps + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (out_row >= int64_t(p.n_tokens) * p.n_heads) return;  // the whole warp leaves together
  const int token = int(out_row / p.n_heads), head = int(out_row % p.n_heads);
  const int kv_head = head / a.group, seq = sequence_of_token(p, token);
  const int n_keys = max(0, min(p.positions[token] + 1, a.key_cap));

  float q[kFallbackDims], acc[kFallbackDims];
#pragma unroll
  for (int j = 0; j < kFallbackDims; ++j) {
    const int d = lane + 32 * j;
    q[j] = d < p.d_k ? bf16_to_float(p.q[out_row * p.d_k + d]) : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int key = 0; key < n_keys; ++key) {
    const int64_t cache_row = int64_t(slot_of(a, seq, key)) * p.n_kv_heads + kv_head;
    // An FP8 cache's values are E4M3 bytes (their scales are in scale_log2 and v_scale).
    const auto cached = [&](const void* cache, int64_t i) {
      return p.fp8_cache ? e4m3_to_float(static_cast<const uint8_t*>(cache)[i])
                         : bf16_to_float(static_cast<const uint16_t*>(cache)[i]);
    };
    const int64_t k_row = cache_row * p.d_k, v_row = cache_row * p.d_v;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kFallbackDims; ++j)
      if (lane + 32 * j < p.d_k) dot += q[j] * cached(p.k_cache, k_row + lane + 32 * j);
    const float score = warp_sum(dot) * a.scale_log2;
    const float m_new = fmaxf(m, score);
    const float alpha = exp2_approx(m - m_new), weight = exp2_approx(score - m_new);
    l = l * alpha + weight;
#pragma unroll
    for (int j = 0; j < kFallbackDims; ++j)
      if (lane + 32 * j < p.d_v) acc[j] = acc[j] * alpha + weight * cached(p.v_cache, v_row + lane + 32 * j);
    m = m_new;
  }
  const float inv = l > 0.0f ? a.v_scale / l : 0.0f;
#pragma unroll
  for (int j = 0; j < kFallbackDims; ++j)
    if (lane + 32 * j < p.d_v) p.out[out_row * p.d_v + lane + 32 * j] = to_bf16(acc[j] * inv);
}

// ---- host ----

// The configurations, measured on an H200 (the test's timing cases). Decode: 4 warps share
// 16 rows and take 16 keys each of a 64-key tile (D = 256: 2 warps, 32-key tiles); two stages,
// since a third costs more in blocks per SM than it gains in bytes in flight. Prefill: 8 warps
// own 128 rows (D = 256: 4 warps, 64 rows) against 32-key tiles, three stages.
// An FP8 cache takes the same tiles, its stages holding bytes; in decode three of them (half a
// BF16 stage each: the warps' merge needs the room), 3 blocks an SM at D = 128 as in BF16.
template <int D, bool kFp8 = false>
using DecodeTile = TileShape<D, D == 256 ? 2 : 4, D == 256 ? 32 : 64, kFp8 ? 3 : 2, true, kFp8>;
template <int D, bool kFp8 = false>
using PrefillTile = TileShape<D, D == 256 ? 4 : 8, 32, D == 256 ? 2 : 3, false, kFp8>;

constexpr int kDecodeRows = 16;  // a sequence's rows that take the decode path: one mma tile
static_assert(DecodeTile<64>::kRows == kDecodeRows && DecodeTile<256>::kRows == kDecodeRows,
              "decode blocks share one warp's rows");
constexpr int kPrefillBlocksPerSm = 2;  // prefill splits until the grid has this many blocks per SM
constexpr int kPrefillMinSplitKeys = 512;

struct TileGeometry {
  int rows, keys;     // query rows and keys of one block's tile
  int blocks_per_sm;  // blocks an SM holds at once (the launch bounds make it so)
};

template <class T>
constexpr TileGeometry geometry_of() {
  return {T::kRows, T::kKeys, T::kMinBlocks};
}

template <bool kFp8>
TileGeometry tile_geometry_of(int d, bool decode) {
  switch (d) {
    case 64: return decode ? geometry_of<DecodeTile<64, kFp8>>() : geometry_of<PrefillTile<64, kFp8>>();
    case 128: return decode ? geometry_of<DecodeTile<128, kFp8>>() : geometry_of<PrefillTile<128, kFp8>>();
    default: return decode ? geometry_of<DecodeTile<256, kFp8>>() : geometry_of<PrefillTile<256, kFp8>>();
  }
}

TileGeometry tile_geometry(int d, bool decode, bool fp8) {
  return fp8 ? tile_geometry_of<true>(d, decode) : tile_geometry_of<false>(d, decode);
}

// Decode's split count for `work` blocks' worth of items on `slots` resident blocks: a block's
// time is about its keys, 1 / splits of an item's, so a launch takes waves / splits of an
// unsplit one; the fewest splits that minimize it, among those that fill at most two waves
// (past that, each block's fixed costs outgrow what a shorter tail saves).
int64_t decode_splits(int64_t work, int64_t slots, int64_t max_splits) {
  if (work >= slots) return 1;
  int64_t best = 1, best_waves = 1;  // waves of `best` splits: best_waves / best is the cost
  for (int64_t s = 2; s <= std::min(max_splits, ceil_div(2 * slots, work)); ++s) {
    const int64_t waves = ceil_div(work * s, slots);
    if (waves * best < best_waves * s) best = s, best_waves = waves;
  }
  return best;
}

void check_params(const PagedAttentionParams& p, int sm_count) {
  TETRA_CHECK(p.n_tokens > 0, "paged_attention: n_tokens is ", p.n_tokens);
  TETRA_CHECK(p.n_seqs >= 1 && p.n_seqs <= 65535, "paged_attention: n_seqs must be 1..65535, not ", p.n_seqs);
  TETRA_CHECK(p.n_heads >= 1 && p.n_kv_heads >= 1 && p.n_kv_heads <= 65535 && p.n_heads % p.n_kv_heads == 0,
              "paged_attention: ", p.n_heads, " heads cannot share ", p.n_kv_heads, " KV heads");
  TETRA_CHECK(p.d_k >= 1 && p.d_k <= kMaxHeadDim && p.d_v >= 1 && p.d_v <= kMaxHeadDim,
              "paged_attention: head dims must be 1..", kMaxHeadDim, ", not d_k ", p.d_k, ", d_v ", p.d_v);
  TETRA_CHECK(p.block_size >= 1 && p.block_size <= 1024, "paged_attention: block_size must be 1..1024, not ",
              p.block_size);
  TETRA_CHECK(p.max_blocks_per_seq >= 1, "paged_attention: max_blocks_per_seq is ", p.max_blocks_per_seq);
  TETRA_CHECK(p.max_query_len >= 1 && p.max_query_len <= p.n_tokens,
              "paged_attention: max_query_len ", p.max_query_len, " does not fit ", p.n_tokens, " tokens");
  TETRA_CHECK(p.max_seq_len >= 1 && int64_t(p.max_seq_len) <= int64_t(p.max_blocks_per_seq) * p.block_size,
              "paged_attention: max_seq_len ", p.max_seq_len, " does not fit ", p.max_blocks_per_seq,
              " blocks of ", p.block_size);
  TETRA_CHECK(std::isfinite(p.scale), "paged_attention: scale is ", p.scale);
  TETRA_CHECK(std::isfinite(p.k_scale) && p.k_scale > 0 && std::isfinite(p.v_scale) && p.v_scale > 0,
              "paged_attention: the cache scales must be positive, not ", p.k_scale, " and ", p.v_scale);
  TETRA_CHECK(p.fp8_cache || (p.k_scale == 1.0f && p.v_scale == 1.0f),
              "paged_attention: a BF16 cache has no scales");
  TETRA_CHECK(sm_count >= 1, "paged_attention: sm_count is ", sm_count);
  TETRA_CHECK(p.q && p.k_cache && p.v_cache && p.out && p.positions && p.seq_starts && p.block_tables,
              "paged_attention: a tensor pointer is null");
}

PagedAttentionPlan make_plan(const PagedAttentionParams& p, int sm_count) {
  PagedAttentionPlan plan;
  if (p.n_tokens == 0) return plan;  // nothing to run, nothing to check
  check_params(p, sm_count);
  const int chunk = p.fp8_cache ? 16 : 8;  // values in a 16-byte copy: rows are whole copies
  const bool dims_tile = p.d_k % chunk == 0 && p.d_v % chunk == 0;
  const bool aligned = aligned16(p.q) && aligned16(p.k_cache) && aligned16(p.v_cache) && aligned16(p.out);
  if (!dims_tile || !aligned) return plan;
  const int d = std::max(p.d_k, p.d_v);
  plan.head_dim_tile = d <= 64 ? 64 : d <= 128 ? 128 : 256;
  const int64_t rows = int64_t(p.max_query_len) * (p.n_heads / p.n_kv_heads);
  const bool decode = rows <= kDecodeRows;
  const bool wgmma = !decode && !p.fp8_cache && p.d_k == gqa::kWgmmaHeadDim && p.d_v == gqa::kWgmmaHeadDim;
  plan.path = decode ? PagedAttentionPath::Decode : wgmma ? PagedAttentionPath::PrefillWgmma : PagedAttentionPath::Prefill;
  const TileGeometry tile = wgmma ? TileGeometry{gqa::kWgmmaRows, gqa::kWgmmaKeys, gqa::kWgmmaBlocksPerSm}
                                  : tile_geometry(plan.head_dim_tile, decode, p.fp8_cache);
  const int64_t n_row_tiles = ceil_div(rows, tile.rows);
  TETRA_CHECK(n_row_tiles <= INT_MAX, "paged_attention: ", rows, " query rows per sequence is too many");
  plan.n_row_tiles = int(n_row_tiles);

  // Split the keys when the work items alone would leave SMs idle.
  const int64_t work = int64_t(p.n_seqs) * p.n_kv_heads * plan.n_row_tiles;
  if (decode) {
    // The split count comes from the batch's shape and the step's capacity (max_blocks_per_seq
    // x block_size), not its longest sequence, and each sequence divides its own keys among
    // them (key_range): a sequence's split boundaries, and so its f32 sums, depend on itself
    // alone, so one CUDA graph serves every length and gives eager decode's tokens.
    const int64_t cap = int64_t(p.max_blocks_per_seq) * p.block_size;
    plan.n_splits = int(decode_splits(work, int64_t(tile.blocks_per_sm) * sm_count, ceil_div(cap, tile.keys)));
    plan.keys_per_split = int(std::min<int64_t>(ceil_div(ceil_div(cap, plan.n_splits), tile.keys) * tile.keys, INT_MAX));
  } else {
    const int64_t target_blocks = int64_t(kPrefillBlocksPerSm) * sm_count;
    const int64_t splits_wanted = work >= target_blocks ? 1 : ceil_div(target_blocks, work);
    const int64_t keys = std::max<int64_t>(
        ceil_div(ceil_div(p.max_seq_len, splits_wanted), tile.keys) * tile.keys, kPrefillMinSplitKeys);
    plan.keys_per_split = int(keys);
    plan.n_splits = int(ceil_div(p.max_seq_len, keys));
  }
  TETRA_CHECK(int64_t(plan.n_row_tiles) * plan.n_splits <= INT_MAX, "paged_attention: ", plan.n_row_tiles,
              " row tiles x ", plan.n_splits, " splits is too many blocks");
  return plan;
}

struct WorkspaceLayout {
  int64_t acc_bytes = 0, ml_offset = 0, total_bytes = 0;
};

WorkspaceLayout workspace_layout(const PagedAttentionParams& p, const PagedAttentionPlan& plan) {
  WorkspaceLayout w;
  if (plan.n_splits <= 1) return w;
  const int64_t parts = int64_t(p.n_tokens) * p.n_heads * plan.n_splits;
  w.acc_bytes = parts * p.d_v * int64_t(sizeof(float));
  w.ml_offset = ceil_div(w.acc_bytes, 256) * 256;
  w.total_bytes = w.ml_offset + parts * int64_t(sizeof(float2));
  return w;
}

template <class T>
void launch_mma(const KernelLaunch& launch, const KernelArgs& a, const PagedAttentionPlan& plan) {
  const auto kernel = attention_mma_kernel<T>;
  if constexpr (T::kSmemBytes > 48 * 1024) {
    static const bool raised = [&] {  // once per process (for the current device)
      TETRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
      return true;
    }();
    (void)raised;
  }
  const dim3 grid(unsigned(plan.n_row_tiles) * unsigned(plan.n_splits), unsigned(a.p.n_kv_heads),
                  unsigned(a.p.n_seqs));
  launch_kernel(launch, kernel, grid, T::kThreads, T::kSmemBytes, a);
  TETRA_CUDA_CHECK_LAUNCH("paged_attention mma");
}

template <bool kFp8>
void launch_tiles_of(const KernelLaunch& launch, const KernelArgs& a, const PagedAttentionPlan& plan) {
  const bool decode = plan.path == PagedAttentionPath::Decode;
  switch (plan.head_dim_tile) {
    case 64:
      return decode ? launch_mma<DecodeTile<64, kFp8>>(launch, a, plan)
                    : launch_mma<PrefillTile<64, kFp8>>(launch, a, plan);
    case 128:
      return decode ? launch_mma<DecodeTile<128, kFp8>>(launch, a, plan)
                    : launch_mma<PrefillTile<128, kFp8>>(launch, a, plan);
    case 256:
      return decode ? launch_mma<DecodeTile<256, kFp8>>(launch, a, plan)
                    : launch_mma<PrefillTile<256, kFp8>>(launch, a, plan);
    default: fail("paged_attention: no tile for head dim ", plan.head_dim_tile);
  }
}

void launch_tiles(const KernelLaunch& launch, const KernelArgs& a, const PagedAttentionPlan& plan) {
  return a.p.fp8_cache ? launch_tiles_of<true>(launch, a, plan) : launch_tiles_of<false>(launch, a, plan);
}

}  // namespace

PagedAttentionPlan paged_attention_plan(const PagedAttentionParams& p, int sm_count) {
  return make_plan(p, sm_count);
}

int64_t paged_attention_workspace_bytes(const PagedAttentionParams& p, int sm_count) {
  return workspace_layout(p, make_plan(p, sm_count)).total_bytes;
}

void paged_attention(const KernelLaunch& launch, const PagedAttentionParams& p, void* workspace,
                     int64_t workspace_bytes, int sm_count) {
  if (p.n_tokens == 0) return;
  const PagedAttentionPlan plan = make_plan(p, sm_count);
  const WorkspaceLayout ws = workspace_layout(p, plan);
  TETRA_CHECK(workspace_bytes >= ws.total_bytes && (ws.total_bytes == 0 || (workspace && aligned16(workspace))),
              "paged_attention: needs ", ws.total_bytes, " bytes of 16-byte aligned workspace, got ",
              workspace_bytes);
  KernelArgs a{};
  a.p = p;
  a.group = p.n_heads / p.n_kv_heads;
  a.n_splits = plan.n_splits;
  a.keys_per_split = plan.keys_per_split;
  a.key_cap = int(std::min<int64_t>(int64_t(p.max_blocks_per_seq) * p.block_size, INT_MAX));
  a.scale_log2 = p.scale * kLog2e * p.k_scale;
  a.v_scale = p.v_scale;
  a.block = FastDivisor(uint32_t(p.block_size));
  if (ws.total_bytes > 0) {
    a.partial_acc = static_cast<float*>(workspace);
    a.partial_ml = reinterpret_cast<float2*>(static_cast<uint8_t*>(workspace) + ws.ml_offset);
  }

  if (plan.path == PagedAttentionPath::Fallback) {
    const int64_t n_blocks = ceil_div(int64_t(p.n_tokens) * p.n_heads, kFallbackWarps);
    TETRA_CHECK(n_blocks <= INT_MAX, "paged_attention: ", p.n_tokens, " tokens x ", p.n_heads, " heads is too many");
    launch_kernel(launch, attention_fallback_kernel, unsigned(n_blocks), kFallbackWarps * 32, 0, a);
    TETRA_CUDA_CHECK_LAUNCH("paged_attention fallback");
    return;
  }
  if (plan.path == PagedAttentionPath::PrefillWgmma) gqa::launch_prefill_wgmma(launch, a, plan);
  else launch_tiles(launch, a, plan);
  if (plan.n_splits > 1) {
    launch_kernel(launch, combine_splits_kernel, unsigned(int64_t(p.n_tokens) * p.n_heads), kCombineWarps * 32, 0, a);
    TETRA_CUDA_CHECK_LAUNCH("paged_attention combine");
  }
}

}  // namespace tetra::ops::cuda
