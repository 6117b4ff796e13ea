// What the MLA attention kernels share (attention_mla.cu's mma.sync kernel and
// attention_mla_wgmma.cu's): the launch arguments, and how a block finds its group of query
// rows, its split of the keys and each key's cache slot.
#pragma once

#include <climits>
#include <cstdint>

#include "ops/cuda/attention_mla.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/mma_sync.cuh"

namespace tetra::ops::cuda::mla {

constexpr int kRank = 512, kRope = 64, kWidth = kRank + kRope;  // the shape the tiled kernels take
constexpr int kKeys = 64;                                       // keys a tile
// A split takes at least one tile. More splits of fewer keys cost more partial results to
// write and merge, but at one sequence they bring SMs in: GLM-5 at 4k keys, 64 one-tile
// splits took 20.4 us where 16 splits of 4 tiles took 23.6 (H200).
constexpr int kMinSplitKeys = kKeys;

struct MlaArgs {
  MlaAttentionParams p;
  int n_splits;
  bool cluster_merge;  // the splits of a row tile are one cluster (wgmma only)
  int key_cap;         // max_blocks_per_seq * block_size
  float scale_log2;    // scale * log2(e): the softmax runs on exp2
  float* partial_acc;  // [n_tokens, n_heads, n_splits, rank]
  float2* partial_ml;  // [n_tokens, n_heads, n_splits]: max (log2 units), sum of p
};

__device__ __forceinline__ int cache_slot(const int32_t* block_tables, int max_blocks_per_seq, int block_size,
                                          int seq, int key) {
  const int block = block_tables[int64_t(seq) * max_blocks_per_seq + key / block_size];
  return block * block_size + key % block_size;
}

// The last sequence starting at or before `token`.
__device__ __forceinline__ int sequence_of(const int32_t* seq_starts, int n_seqs, int token) {
  int lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (seq_starts[mid] <= token) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One block's rows and keys. A group is a sequence's (token, head) rows packed token-major, or
// one token's heads when the DSA chose its keys; gridDim.x counts its row tiles times the splits.
struct Work {
  int seq, split;
  int token_begin, n_rows, row0;
  bool by_token;           // keys from `selected` of token token_begin
  int key_begin, key_end;  // key indices of this split (positions, or entries of `selected`)
};

__device__ __forceinline__ Work block_group(const MlaArgs& a) {
  Work w{};
  w.split = int(blockIdx.x) % a.n_splits;
  w.by_token = a.p.selected != nullptr;
  if (w.by_token) {
    w.token_begin = int(blockIdx.y);
    w.seq = sequence_of(a.p.seq_starts, a.p.n_seqs, w.token_begin);
    w.n_rows = a.p.n_heads;
  } else {
    w.seq = int(blockIdx.y);
    w.token_begin = a.p.seq_starts[w.seq];
    w.n_rows = (a.p.seq_starts[w.seq + 1] - w.token_begin) * a.p.n_heads;
  }
  return w;
}

// The last key row `row` of the group sees, or -1 for a padding row; its token and head.
__device__ __forceinline__ int row_key_limit(const MlaArgs& a, const Work& w, int row, int& token, int& head) {
  token = w.token_begin + row / a.p.n_heads;
  head = row % a.p.n_heads;
  if (row >= w.n_rows) return -1;
  return w.by_token ? INT_MAX : a.p.positions[token];
}

// The keys of the row tile at w.row0 (`rows` rows): every row's, cut at the cap, split evenly
// in whole tiles. Sets w.key_begin and w.key_end; returns the tiles of this split.
__device__ __forceinline__ int split_keys(const MlaArgs& a, Work& w, int rows) {
  int tile_last;
  if (w.by_token) {
    tile_last = a.p.top_k - 1;
  } else {
    const int last_row = min(w.row0 + rows, w.n_rows) - 1;
    tile_last = a.p.positions[w.token_begin + last_row / a.p.n_heads];  // token-major: the last is the latest
  }
  const int n_keys = min(tile_last + 1, w.by_token ? a.p.top_k : a.key_cap);
  const int per_split = max(kMinSplitKeys, (n_keys + a.n_splits * kKeys - 1) / (a.n_splits * kKeys) * kKeys);
  w.key_begin = w.split * per_split;
  w.key_end = w.split == a.n_splits - 1 ? n_keys : min(n_keys, w.key_begin + per_split);
  return w.key_end > w.key_begin ? (w.key_end - w.key_begin + kKeys - 1) / kKeys : 0;
}

// The cache slot of key index `key` of the work, or -1: past the split, or an unused or
// out-of-range entry of `selected`.
__device__ __forceinline__ int slot_of_key(const MlaArgs& a, const Work& w, int key) {
  if (key >= w.key_end) return -1;
  int position = key;
  if (w.by_token) {
    position = a.p.selected[int64_t(w.token_begin) * a.p.top_k + key];
    if (position < 0 || position > a.p.positions[w.token_begin] || position >= a.key_cap) return -1;
  }
  return cache_slot(a.p.block_tables, a.p.max_blocks_per_seq, a.p.block_size, w.seq, position);
}

// ---- an FP8 cache ----
// Both tiled kernels stage a tile's E4M3 rows with cp.async (half a BF16 tile's bytes), then
// widen them into the BF16 tile their MMAs read, between two barriers: the MMAs stay BF16 and
// see exactly the values a BF16 cache would hold.
constexpr int kFp8Chunks = kWidth / 16;           // 16-byte chunks of an E4M3 row: 36
constexpr int kFp8TileBytes = kKeys * kWidth;     // a staged tile, rows unpadded: 36,864

// A tile's E4M3 rows into `stage` by kCopiers threads (t: this one's index among them): chunk i
// of the tile (row i / 36) at byte 16 i; keys without a slot are zeros.
template <int kCopiers>
__device__ __forceinline__ void copy_fp8_tile(const MlaArgs& a, const int32_t* slots, uint32_t stage, int t) {
  static_assert(kKeys * kFp8Chunks % kCopiers == 0, "equal copies per thread");
  const uint8_t* cache = static_cast<const uint8_t*>(a.p.cache);
#pragma unroll 3
  for (int i = t; i < kKeys * kFp8Chunks; i += kCopiers) {
    const int r = i / kFp8Chunks, c = i % kFp8Chunks, slot = slots[r];
    cp_async_16(stage + uint32_t(16 * i), cache + (slot >= 0 ? int64_t(slot) * kWidth + 16 * c : 0), slot >= 0);
  }
}

// The staged tile widened to BF16 by kThreads threads: chunk c of row r (values 16c .. 16c + 15)
// becomes the tile's 16-byte BF16 units 2c and 2c + 1 of that row, at unit_addr(r, unit).
template <int kThreads, class UnitAddr>
__device__ __forceinline__ void widen_fp8_tile(const uint8_t* stage, UnitAddr unit_addr, int t) {
  static_assert(kKeys * kFp8Chunks % kThreads == 0, "equal chunks per thread");
#pragma unroll 3
  for (int i = t; i < kKeys * kFp8Chunks; i += kThreads) {
    const int r = i / kFp8Chunks, c = i % kFp8Chunks;
    uint32_t v[8];
    widen_e4m3x16(*reinterpret_cast<const uint4*>(stage + 16 * i), v);
    st_shared_16(unit_addr(r, 2 * c), v[0], v[1], v[2], v[3]);
    st_shared_16(unit_addr(r, 2 * c + 1), v[4], v[5], v[6], v[7]);
  }
}

// The wgmma kernel (attention_mla_wgmma.cu): 64 rows a block, gridDim as for the tiled one;
// a.p.fp8_cache picks its FP8 instance.
constexpr int kWgmmaRows = 64;
void launch_mla_wgmma(const KernelLaunch& launch, const MlaArgs& a, dim3 grid);
// Whether every block of a wgmma grid of `blocks` fits the GPU at once in clusters of
// `cluster` (2, 4 or 8): the splits of a row tile can then merge in the kernel.
bool mla_wgmma_clusters_fit(int cluster, int64_t blocks);

}  // namespace tetra::ops::cuda::mla
