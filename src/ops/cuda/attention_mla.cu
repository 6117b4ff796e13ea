// MLA attention (absorbed) on sm_90a; see attention_mla.h.
//
// Groups of 64 rows and more take the wgmma kernel (attention_mla_wgmma.cu); smaller ones
// this file's tiled kernel: a block owns 32 query rows of one group (a sequence's (token, head)
// rows packed token-major, or one token's heads when the DSA chose its keys) and one key
// split, and streams 64-key tiles of 576-value cache rows through two shared-memory stages
// with cp.async, two barriers a tile. Its 8 warps are two row groups of 16 rows, and the 4
// warps of a group split the work of a tile without repeating any of it: warp w scores the
// rows against dims [144w, 144w + 144) of the keys, the four partial score tiles meet in
// shared memory and every warp adds them in the same order (so all hold the same scores and
// softmax state), then warp w accumulates output dims [128w, 128w + 128) of P V, V being the
// first 512 values of the same rows. Splits leave (max, sum, unnormalized
// output) in the workspace for combine_kernel, as flash-decoding does. An FP8 cache stages E4M3
// tiles in the room of the second BF16 stage and widens each into the first (one more barrier a
// tile; attention_mla_internal.cuh). The DSA's key choice is dsa_select.cu's.
#include "ops/cuda/attention_mla.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/attention_mla_internal.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_sync.cuh"

namespace tetra::ops::cuda {
namespace {

using namespace mla;

constexpr float kLog2e = 1.4426950408889634f;

// ---- the tiled kernel ----

namespace tiled {
constexpr int kDimWarps = 4, kRowGroups = 2, kWarps = kDimWarps * kRowGroups, kThreads = 32 * kWarps;
constexpr int kRows = 16 * kRowGroups, kStages = 2, kSlotBuffers = 3;
constexpr int kStride = kWidth + 8;             // a 16-byte skew: ldmatrix rows in 8 bank groups
constexpr int kChunks = kWidth / 8;             // 16-byte chunks of a row
constexpr int kScoreSteps = kWidth / 16 / kDimWarps;  // 16-dim k-steps of the scores per warp
constexpr int kOutDims = kRank / kDimWarps;        // output dims per warp
constexpr int kQBytes = kRows * kStride * 2;
constexpr int kTileBytes = kKeys * kStride * 2;
constexpr int kPartialOffset = kQBytes + kStages * kTileBytes;
constexpr int kPartialBytes = kWarps * 16 * kKeys * 4;
constexpr int kSlotsOffset = kPartialOffset + kPartialBytes;
constexpr int kSmemBytes = kSlotsOffset + kSlotBuffers * kKeys * 4;
static_assert(kWidth % (16 * kDimWarps) == 0 && kRank % (16 * kDimWarps) == 0, "whole k-steps and n-tiles per warp");
static_assert(kRows * kChunks % kThreads == 0 && kKeys * kChunks % kThreads == 0, "equal copies per thread");
static_assert(kKeys <= kThreads, "one thread finds each key's slot");
static_assert(kSmemBytes <= 227 * 1024, "one block fits an SM");
// An FP8 cache: the BF16 tile in stage 0, two staged E4M3 tiles after it.
constexpr int kFp8StagingOffset = kQBytes + kTileBytes;
static_assert(kTileBytes % 16 == 0 && kTileBytes + 2 * kFp8TileBytes <= kStages * kTileBytes,
              "the E4M3 stages fit in the second BF16 stage's room");

__device__ __forceinline__ void load_q(const MlaArgs& a, const Work& w, uint16_t* q_smem) {
  const int H = a.p.n_heads;
  for (int i = int(threadIdx.x); i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, row = w.row0 + r;
    const bool valid = row < w.n_rows;
    const uint16_t* src = a.p.q_latent;
    if (valid) {
      const int64_t qrow = int64_t(w.token_begin + row / H) * H + row % H;
      src = c < kRank / 8 ? a.p.q_latent + qrow * kRank + 8 * c : a.p.q_rope + qrow * kRope + 8 * (c - kRank / 8);
    }
    cp_async_16(smem_addr(q_smem + r * kStride + 8 * c), src, valid);
  }
}

__device__ __forceinline__ void copy_tile(const MlaArgs& a, const int32_t* slots, uint16_t* tile) {
#pragma unroll 4
  for (int i = int(threadIdx.x); i < kKeys * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, slot = slots[r];
    const uint16_t* cache = static_cast<const uint16_t*>(a.p.cache);
    const uint16_t* src = slot >= 0 ? cache + int64_t(slot) * kWidth + 8 * c : cache;
    cp_async_16(smem_addr(tile + r * kStride + 8 * c), src, slot >= 0);
  }
}

// A key tile into shared memory: a BF16 one into its stage; an FP8 one into its E4M3 staging
// buffer, widened into stage 0 at the top of its iteration.
template <bool kFp8>
__device__ __forceinline__ void copy_key_tile(const MlaArgs& a, const int32_t* slots, uint8_t* smem, int tile) {
  if constexpr (kFp8) {
    copy_fp8_tile<kThreads>(a, slots, smem_addr(smem + kFp8StagingOffset + (tile % 2) * kFp8TileBytes),
                            int(threadIdx.x));
  } else {
    copy_tile(a, slots, reinterpret_cast<uint16_t*>(smem + kQBytes + (tile % kStages) * kTileBytes));
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_tiled_kernel(const MlaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ __align__(128) uint8_t smem[];
  uint16_t* q_smem = reinterpret_cast<uint16_t*>(smem);
  const auto tile_smem = [&](int s) { return reinterpret_cast<uint16_t*>(smem + kQBytes + s * kTileBytes); };
  float* partial = reinterpret_cast<float*>(smem + kPartialOffset);
  const auto slots = [&](int s) { return reinterpret_cast<int32_t*>(smem + kSlotsOffset) + s * kKeys; };
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int group = warp / kDimWarps, dim_warp = warp % kDimWarps;  // rows 16 * group ..; dims by dim_warp
  const int H = a.p.n_heads;

  Work w = block_group(a);
  const int tile_stride = int(gridDim.x) / a.n_splits;
  for (int row_tile = int(blockIdx.x) / a.n_splits; row_tile * kRows < w.n_rows; row_tile += tile_stride) {
    w.row0 = row_tile * kRows;
    // The lane's rows g and g + 8, and the last key each sees (-1: a padding row).
    int row_token[2], row_head[2], key_limit[2];
    bool row_valid[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      key_limit[r] = row_key_limit(a, w, w.row0 + 16 * group + g + 8 * r, row_token[r], row_head[r]);
      row_valid[r] = key_limit[r] >= 0;
    }
    const int n_tiles = split_keys(a, w, kRows);

    float acc[kOutDims / 8][4];
#pragma unroll
    for (int n = 0; n < kOutDims / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    if (n_tiles > 0) {
      if (tid < kKeys) {
        slots(0)[tid] = slot_of_key(a, w, w.key_begin + tid);
        slots(1)[tid] = slot_of_key(a, w, w.key_begin + kKeys + tid);
      }
      load_q(a, w, q_smem);
      __syncthreads();  // the slots of tiles 0 and 1
      copy_key_tile<kFp8>(a, slots(0), smem, 0);
      cp_async_commit();  // Q and tile 0
    }
    for (int it = 0; it < n_tiles; ++it) {
      const int next = it + 1;
      cp_async_wait<0>();
      // Tile it landed for every thread; every warp is past iteration it - 1, so the other
      // stage (or staging buffer), stage 0 of an FP8 cache and the partial scores are free, and
      // the slots of tile it + 1 are visible.
      __syncthreads();
      if (next < n_tiles) copy_key_tile<kFp8>(a, slots(next % kSlotBuffers), smem, next);
      cp_async_commit();
      // Tile it + 2's slots take the buffer of tile it - 1 (done with at its mask and copy).
      if (tid < kKeys) slots((it + 2) % kSlotBuffers)[tid] = slot_of_key(a, w, w.key_begin + (it + 2) * kKeys + tid);
      if constexpr (kFp8) {
        widen_fp8_tile<kThreads>(
            smem + kFp8StagingOffset + (it % 2) * kFp8TileBytes,
            [&](int r, int unit) { return smem_addr(tile_smem(0) + r * kStride + 8 * unit); }, tid);
        __syncthreads();  // the widened tile
      }

      const uint16_t* tile = tile_smem(kFp8 ? 0 : it % kStages);
      // Partial scores over this warp's dims, for all 64 keys.
      float s[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
      const uint32_t q_addr = smem_addr(q_smem + (16 * group + lane % 16) * kStride + (lane / 16) * 8);
      const uint32_t k_addr = smem_addr(tile + ((lane / 16) * 8 + lane % 8) * kStride + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int j = 0; j < kScoreSteps; ++j) {
        const int kk = dim_warp * kScoreSteps + j;
        uint32_t qa[4];
        ldmatrix_x4(qa, q_addr + kk * 32);
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          uint32_t kb[4];
          ldmatrix_x4(kb, k_addr + np * 16 * kStride * 2 + kk * 32);
          mma_bf16_16x8x16(s[2 * np], qa, kb[0], kb[1]);
          mma_bf16_16x8x16(s[2 * np + 1], qa, kb[2], kb[3]);
        }
      }
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[((warp * (kKeys / 8) + n) * 4 + i) * 32 + lane] = s[n][i];
      __syncthreads();  // the partial scores of every warp
      // The whole scores, in the same order in every warp; then the online softmax.
      const int key0 = w.key_begin + it * kKeys;
      const int32_t* tile_slots = slots(it % kSlotBuffers);
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float x = 0.0f;
#pragma unroll
          for (int v = group * kDimWarps; v < (group + 1) * kDimWarps; ++v)
            x += partial[((v * (kKeys / 8) + n) * 4 + i) * 32 + lane];
          const int k = 8 * n + 2 * t4 + (i & 1);
          x *= a.scale_log2;
          if (tile_slots[k] < 0 || key0 + k > key_limit[i / 2]) x = -INFINITY;
          s[n][i] = x;
          tile_max[i / 2] = fmaxf(tile_max[i / 2], x);
        }
      float base[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
        base[r] = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: exp2(-inf - 0) = 0, not NaN
        alpha[r] = exp2_approx(m[r] - base[r]);
        m[r] = m_new;
      }
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[n][i] = exp2_approx(s[n][i] - base[i / 2]);
          tile_sum[i / 2] += s[n][i];
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + tile_sum[r];
#pragma unroll
      for (int n = 0; n < kOutDims / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[n][i] *= alpha[i / 2];
      // O[:, this warp's dims] += P V; P's accumulators are the A operand as they stand.
      const uint32_t v_addr = smem_addr(tile + (((lane / 8) % 2) * 8 + lane % 8) * kStride + (lane / 16) * 8 +
                                        dim_warp * kOutDims);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < kOutDims / 16; ++np) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_addr + kk * 16 * kStride * 2 + np * 32);
          mma_bf16_16x8x16(acc[2 * np], pa, vb[0], vb[1]);
          mma_bf16_16x8x16(acc[2 * np + 1], pa, vb[2], vb[3]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = quad_sum(l[r]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!row_valid[r]) continue;
      const int64_t out_row = int64_t(row_token[r]) * H + row_head[r];
      if (a.n_splits > 1) {
        const int64_t part = out_row * a.n_splits + w.split;
        float* dst = a.partial_acc + part * kRank + dim_warp * kOutDims;
#pragma unroll
        for (int n = 0; n < kOutDims / 8; ++n)
          *reinterpret_cast<float2*>(dst + 8 * n + 2 * t4) = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
        if (dim_warp == 0 && t4 == 0) a.partial_ml[part] = make_float2(m[r], l[r]);
      } else {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // no key at all: 0
        uint16_t* dst = a.p.out + out_row * kRank + dim_warp * kOutDims;
#pragma unroll
        for (int n = 0; n < kOutDims / 8; ++n)
          *reinterpret_cast<uint32_t*>(dst + 8 * n + 2 * t4) =
              pack_bf16x2(acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
      }
    }
    __syncthreads();  // Q, the stages and the slots are refilled for the next row tile
  }
}
}  // namespace tiled

// ---- split combine ----

constexpr int kCombineThreads = 256;
constexpr int kMaxCombineGroups = 16;
constexpr int kMaxSplits = 1024;

// How a combine block divides its work: `groups` threads share each 4 dims (float4 lane),
// each summing every groups-th split, so that a row of many splits (one sequence, a long
// context) has all of its partial sums in flight at once rather than one split after another.
struct CombineShape {
  int groups, lanes;  // threads a lane, lanes a block
  int blocks_per_row;
};

CombineShape combine_shape(int n_splits, int rank) {
  CombineShape c;
  c.groups = 1;
  while (c.groups * 2 <= std::min(kMaxCombineGroups, n_splits / 4)) c.groups *= 2;  // at least 4 splits a thread
  c.lanes = std::min(kCombineThreads / c.groups, rank / 4);
  c.blocks_per_row = rank / 4 / c.lanes;
  return c;
}

// Over the block, the same value in every thread; `scratch` holds a value per warp.
template <bool kMax>
__device__ __forceinline__ float combine_reduce(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, u) : v + u;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < int(blockDim.x) / 32; ++w) v = kMax ? fmaxf(v, scratch[w]) : v + scratch[w];
  __syncthreads();  // scratch is reused
  return v;
}

// Block (row, chunk) of one (token, head) row: out = sum_i 2^(m_i - M) acc_i / sum_i 2^(m_i - M)
// l_i over the splits with a key. Every block finds the splits' weights, in parallel, into
// shared memory; thread (group, lane) sums the float4 of dims `lane` of splits group, group +
// groups, ...; then lane's groups are added in group order. Every order is fixed by the plan:
// the result does not depend on timing.
__global__ void __launch_bounds__(kCombineThreads) mla_combine_kernel(const MlaArgs a, CombineShape c) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float weight[kMaxSplits];
  __shared__ float scratch[kCombineThreads / 32];
  __shared__ float4 part[kCombineThreads];
  const int64_t out_row = blockIdx.x / c.blocks_per_row;
  const int rank = a.p.rank, n = a.n_splits, tid = int(threadIdx.x), stride = int(blockDim.x);
  const float2* ml = a.partial_ml + out_row * n;
  float m_max = -INFINITY;
  for (int i = tid; i < n; i += stride) m_max = fmaxf(m_max, ml[i].x);
  m_max = combine_reduce<true>(m_max, scratch);
  float l_sum = 0.0f;
  for (int i = tid; i < n; i += stride) {
    const float2 v = ml[i];
    const float w = v.x == -INFINITY ? 0.0f : exp2_approx(v.x - m_max);  // no key: nothing
    weight[i] = w;
    l_sum += w * v.y;
  }
  l_sum = combine_reduce<false>(l_sum, scratch);  // its barriers publish the weights too
  const int lane = tid % c.lanes, group = tid / c.lanes;
  const int d = 4 * ((int(blockIdx.x) % c.blocks_per_row) * c.lanes + lane);
  const float* acc = a.partial_acc + out_row * n * rank + d;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int i = group; i < n; i += c.groups) {
    const float4 v = *reinterpret_cast<const float4*>(acc + int64_t(i) * rank);
    const float w = weight[i];
    o.x += w * v.x, o.y += w * v.y, o.z += w * v.z, o.w += w * v.w;
  }
  part[tid] = o;
  __syncthreads();
  if (group != 0) return;
  for (int g = 1; g < c.groups; ++g) {
    const float4 v = part[g * c.lanes + lane];
    o.x += v.x, o.y += v.y, o.z += v.z, o.w += v.w;
  }
  const float inv = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;
  *reinterpret_cast<uint2*>(a.p.out + out_row * rank + d) =
      make_uint2(pack_bf16x2(o.x * inv, o.y * inv), pack_bf16x2(o.z * inv, o.w * inv));
}

// ---- fallback ----

constexpr int kFallbackWarps = 4;
constexpr int kFallbackMaxWidth = 1024;
constexpr int kFallbackPerLane = kFallbackMaxWidth / 32;

// Value i of a cache row, BF16 or E4M3.
template <bool kFp8>
__device__ __forceinline__ float cache_value(const void* row, int i) {
  if constexpr (kFp8) return e4m3_to_float(static_cast<const uint8_t*>(row)[i]);
  else return bf16_to_float(static_cast<const uint16_t*>(row)[i]);
}

// One warp per (token, head), keys one at a time with an online softmax. Lane l holds dims
// l, l + 32, ... of the row [latent | rope].
template <bool kFp8>
__global__ void __launch_bounds__(kFallbackWarps * 32) mla_fallback_kernel(const MlaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const MlaAttentionParams& p = a.p;
  const int64_t out_row = int64_t(blockIdx.x) * kFallbackWarps + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (out_row >= int64_t(p.n_tokens) * p.n_heads) return;  // the whole warp leaves together
  const int token = int(out_row / p.n_heads);
  const int seq = sequence_of(p.seq_starts, p.n_seqs, token), position = p.positions[token];
  const int width = p.rank + p.d_rope;
  float q[kFallbackPerLane], acc[kFallbackPerLane];
#pragma unroll
  for (int j = 0; j < kFallbackPerLane; ++j) {
    const int d = lane + 32 * j;
    q[j] = d < p.rank ? bf16_to_float(p.q_latent[out_row * p.rank + d])
           : d < width ? bf16_to_float(p.q_rope[out_row * p.d_rope + d - p.rank])
                       : 0.0f;
    acc[j] = 0.0f;
  }
  const int n_keys = p.selected ? p.top_k : max(0, min(position + 1, a.key_cap));
  float m = -INFINITY, l = 0.0f;
  for (int key = 0; key < n_keys; ++key) {
    int pos = key;
    if (p.selected) {
      pos = p.selected[int64_t(token) * p.top_k + key];
      if (pos < 0 || pos > position || pos >= a.key_cap) continue;
    }
    const int64_t slot = cache_slot(p.block_tables, p.max_blocks_per_seq, p.block_size, seq, pos);
    const void* row = static_cast<const uint8_t*>(p.cache) + slot * width * (kFp8 ? 1 : 2);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kFallbackPerLane; ++j)
      if (lane + 32 * j < width) dot += q[j] * cache_value<kFp8>(row, lane + 32 * j);
    const float score = warp_sum(dot) * a.scale_log2;
    const float m_new = fmaxf(m, score);
    const float alpha = exp2_approx(m - m_new), weight = exp2_approx(score - m_new);
    l = l * alpha + weight;
#pragma unroll
    for (int j = 0; j < kFallbackPerLane; ++j)
      if (lane + 32 * j < p.rank) acc[j] = acc[j] * alpha + weight * cache_value<kFp8>(row, lane + 32 * j);
    m = m_new;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int j = 0; j < kFallbackPerLane; ++j)
    if (lane + 32 * j < p.rank) p.out[out_row * p.rank + lane + 32 * j] = to_bf16(acc[j] * inv);
}

// ---- MLA host ----

constexpr int kTargetBlocksPerSm = 1;  // a tiled block takes a whole SM

void check_params(const MlaAttentionParams& p) {
  TETRA_CHECK(p.n_seqs >= 1 && p.n_seqs <= 65535, "mla_attention: n_seqs must be 1..65535, not ", p.n_seqs);
  TETRA_CHECK(p.n_heads >= 1 && p.rank >= 1 && p.d_rope >= 0,
              "mla_attention: ", p.n_heads, " heads of latent ", p.rank, " and rope ", p.d_rope);
  TETRA_CHECK(p.block_size >= 1 && p.max_blocks_per_seq >= 1, "mla_attention: block_size ", p.block_size,
              ", max_blocks_per_seq ", p.max_blocks_per_seq);
  TETRA_CHECK(p.max_query_len >= 1 && p.max_query_len <= p.n_tokens, "mla_attention: max_query_len ",
              p.max_query_len, " does not fit ", p.n_tokens, " tokens");
  TETRA_CHECK(!p.selected || (p.top_k >= 1 && p.n_tokens <= 65535), "mla_attention: top_k ", p.top_k, " for ",
              p.n_tokens, " tokens");
  TETRA_CHECK(std::isfinite(p.scale), "mla_attention: scale is ", p.scale);
  TETRA_CHECK(p.q_latent && p.q_rope && p.cache && p.out && p.positions && p.seq_starts && p.block_tables,
              "mla_attention: a tensor pointer is null");
}

MlaAttentionPlan make_plan(const MlaAttentionParams& p, int sm_count) {
  MlaAttentionPlan plan;
  if (p.n_tokens == 0) return plan;
  check_params(p);
  const bool shape = p.rank == kRank && p.d_rope == kRope;
  const bool aligned = aligned16(p.q_latent) && aligned16(p.q_rope) && aligned16(p.cache) && aligned16(p.out);
  if (!shape || !aligned) {
    TETRA_CHECK(p.rank + p.d_rope <= kFallbackMaxWidth, "mla_attention: cache rows of ", p.rank + p.d_rope,
                " values; at most ", kFallbackMaxWidth, " outside rank 512 + rope 64");
    return plan;
  }
  const int64_t group_rows = p.selected ? p.n_heads : int64_t(p.max_query_len) * p.n_heads;
  // 64 rows a block on wgmma once a group fills them; fewer rows waste less on 32-row tiles.
  plan.path = group_rows >= kWgmmaRows ? MlaAttentionPath::Wgmma : MlaAttentionPath::Tiled;
  const int rows = plan.path == MlaAttentionPath::Wgmma ? kWgmmaRows : tiled::kRows;
  plan.n_row_tiles = int(std::min<int64_t>(ceil_div(group_rows, rows), INT_MAX / 1024));
  // Split a group's keys when the blocks alone would leave SMs idle: as many splits as fit
  // one wave. The count comes from the batch's shape and the step's capacity, never its
  // lengths, and each block divides its own keys evenly: one CUDA graph serves every length
  // and gives eager decode's sums.
  const int64_t groups = p.selected ? p.n_tokens : p.n_seqs;
  const int64_t work = groups * plan.n_row_tiles;
  const int64_t target = int64_t(kTargetBlocksPerSm) * sm_count;
  const int64_t cap = p.selected ? p.top_k : int64_t(p.max_blocks_per_seq) * p.block_size;
  const int64_t wanted = work >= target ? 1 : target / work;
  plan.n_splits = int(std::clamp<int64_t>(std::min(wanted, ceil_div(cap, kMinSplitKeys)), 1, kMaxSplits));
  const int n = plan.n_splits;
  plan.cluster_merge = plan.path == MlaAttentionPath::Wgmma && (n == 2 || n == 4 || n == 8) &&
                       mla_wgmma_clusters_fit(n, work * n);
  return plan;
}

// The split partials take n_tokens x heads x splits rows, and the plan splits only as far as
// one wave of blocks: at most SMs x (rows a block) rows, whatever the step. Every step asks for
// that bound, so that the measuring pass at the largest steps sizes the arena for the smaller
// ones, which split more.
int64_t partial_rows_bound(const MlaAttentionPlan& plan, int sm_count) {
  if (plan.path == MlaAttentionPath::Fallback) return 0;
  return int64_t(kTargetBlocksPerSm) * sm_count * (plan.path == MlaAttentionPath::Wgmma ? kWgmmaRows : tiled::kRows);
}

int64_t workspace_bytes(const MlaAttentionParams& p, const MlaAttentionPlan& plan, int sm_count, int64_t* ml_offset) {
  const int64_t parts = partial_rows_bound(plan, sm_count);
  if (parts == 0) return 0;
  const int64_t acc = ceil_div(parts * p.rank * int64_t(sizeof(float)), 256) * 256;
  if (ml_offset) *ml_offset = acc;
  return acc + parts * int64_t(sizeof(float2));
}

}  // namespace

MlaAttentionPlan mla_attention_plan(const MlaAttentionParams& p, int sm_count) { return make_plan(p, sm_count); }

int64_t mla_attention_workspace_bytes(const MlaAttentionParams& p, int sm_count) {
  return workspace_bytes(p, make_plan(p, sm_count), sm_count, nullptr);
}

void mla_attention(const KernelLaunch& launch, const MlaAttentionParams& p, void* workspace, int64_t workspace_size,
                   int sm_count) {
  if (p.n_tokens == 0) return;
  const MlaAttentionPlan plan = make_plan(p, sm_count);
  int64_t ml_offset = 0;
  const int64_t need = workspace_bytes(p, plan, sm_count, &ml_offset);
  TETRA_CHECK(plan.n_splits == 1 || int64_t(p.n_tokens) * p.n_heads * plan.n_splits <= partial_rows_bound(plan, sm_count),
              "mla_attention: ", plan.n_splits, " splits of ", p.n_tokens, " tokens overflow the partials' bound");
  TETRA_CHECK(workspace_size >= need && (need == 0 || (workspace && aligned16(workspace))),
              "mla_attention: needs ", need, " bytes of 16-byte aligned workspace, got ", workspace_size);
  MlaArgs a{};
  a.p = p;
  a.n_splits = plan.n_splits;
  a.cluster_merge = plan.cluster_merge;
  a.key_cap = int(std::min<int64_t>(int64_t(p.max_blocks_per_seq) * p.block_size, INT_MAX));
  a.scale_log2 = p.scale * kLog2e;
  if (need > 0) {
    a.partial_acc = static_cast<float*>(workspace);
    a.partial_ml = reinterpret_cast<float2*>(static_cast<uint8_t*>(workspace) + ml_offset);
  }
  if (plan.path == MlaAttentionPath::Fallback) {
    const int64_t n_blocks = ceil_div(int64_t(p.n_tokens) * p.n_heads, kFallbackWarps);
    TETRA_CHECK(n_blocks <= INT_MAX, "mla_attention: ", p.n_tokens, " tokens x ", p.n_heads, " heads is too many");
    launch_kernel(launch, p.fp8_cache ? mla_fallback_kernel<true> : mla_fallback_kernel<false>, unsigned(n_blocks),
                  kFallbackWarps * 32, 0, a);
    TETRA_CUDA_CHECK_LAUNCH("mla_attention fallback");
    return;
  }
  const dim3 grid(unsigned(plan.n_row_tiles) * unsigned(plan.n_splits),
                  unsigned(p.selected ? p.n_tokens : p.n_seqs));
  if (plan.path == MlaAttentionPath::Wgmma) {
    launch_mla_wgmma(launch, a, grid);
  } else {
    launch_kernel(launch, p.fp8_cache ? tiled::mla_tiled_kernel<true> : tiled::mla_tiled_kernel<false>, grid,
                  tiled::kThreads, tiled::kSmemBytes, a);
    TETRA_CUDA_CHECK_LAUNCH("mla_attention tiled");
  }
  if (plan.n_splits > 1 && !plan.cluster_merge) {
    const CombineShape c = combine_shape(plan.n_splits, p.rank);
    const int64_t n_blocks = int64_t(p.n_tokens) * p.n_heads * c.blocks_per_row;
    TETRA_CHECK(n_blocks <= INT_MAX, "mla_attention: ", p.n_tokens, " tokens x ", p.n_heads, " heads is too many");
    launch_kernel(launch, mla_combine_kernel, unsigned(n_blocks), c.groups * c.lanes, 0, a, c);
    TETRA_CUDA_CHECK_LAUNCH("mla_attention combine");
  }
}

}  // namespace tetra::ops::cuda
