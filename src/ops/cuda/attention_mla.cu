// MLA attention (absorbed) and the DSA key choice on sm_90a; see attention_mla.h.
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
// output) in the workspace for combine_kernel, as flash-decoding does.
//
// The DSA select: a scores kernel (a thread per key, the token's queries in shared memory)
// writes each token's scores to the workspace; then a radix select on the scores'
// order-preserving bit patterns in two stages: a block per slice of 16,384 keys keeps the
// slice's top_k, and a block per token takes the top_k of those survivors, written in
// ascending position order.
#include "ops/cuda/attention_mla.h"

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/attention_mla_internal.cuh"
#include "ops/cuda/cuda_check.h"
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
    const uint16_t* src = slot >= 0 ? a.p.cache + int64_t(slot) * kWidth + 8 * c : a.p.cache;
    cp_async_16(smem_addr(tile + r * kStride + 8 * c), src, slot >= 0);
  }
}

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
      copy_tile(a, slots(0), tile_smem(0));
      cp_async_commit();  // Q and tile 0
    }
    for (int it = 0; it < n_tiles; ++it) {
      const int stage = it % kStages, next = it + 1;
      cp_async_wait<0>();
      // Tile it landed for every thread; every warp is past iteration it - 1, so the other
      // stage and the partial scores are free, and the slots of tile it + 1 are visible.
      __syncthreads();
      if (next < n_tiles) copy_tile(a, slots(next % kSlotBuffers), tile_smem(next % kStages));
      cp_async_commit();
      // Tile it + 2's slots take the buffer of tile it - 1 (done with at its mask and copy).
      if (tid < kKeys) slots((it + 2) % kSlotBuffers)[tid] = slot_of_key(a, w, w.key_begin + (it + 2) * kKeys + tid);

      const uint16_t* tile = tile_smem(stage);
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

// One warp per (token, head), keys one at a time with an online softmax. Lane l holds dims
// l, l + 32, ... of the row [latent | rope].
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
    const uint16_t* row =
        p.cache + int64_t(cache_slot(p.block_tables, p.max_blocks_per_seq, p.block_size, seq, pos)) * width;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kFallbackPerLane; ++j)
      if (lane + 32 * j < width) dot += q[j] * bf16_to_float(row[lane + 32 * j]);
    const float score = warp_sum(dot) * a.scale_log2;
    const float m_new = fmaxf(m, score);
    const float alpha = exp2_approx(m - m_new), weight = exp2_approx(score - m_new);
    l = l * alpha + weight;
#pragma unroll
    for (int j = 0; j < kFallbackPerLane; ++j)
      if (lane + 32 * j < p.rank) acc[j] = acc[j] * alpha + weight * bf16_to_float(row[lane + 32 * j]);
    m = m_new;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int j = 0; j < kFallbackPerLane; ++j)
    if (lane + 32 * j < p.rank) p.out[out_row * p.rank + lane + 32 * j] = to_bf16(acc[j] * inv);
}

// ---- MLA host ----

constexpr int kTargetBlocksPerSm = 1;  // a tiled block takes a whole SM

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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

// ---- DSA ----

constexpr int kScoreThreads = 256;  // keys per scores block
constexpr int kMaxIndexHeads = 64;
constexpr int kSelectThreads = 1024;
constexpr int kSliceKeys = 16384;  // keys a stage-1 block selects among
constexpr int kMaxSlices = 1024;
constexpr int64_t kScoreWorkspaceBytes = int64_t(64) << 20;  // scores and survivors of one group of tokens

struct DsaArgs {
  DsaSelectParams p;
  int key_cap;       // max_blocks_per_seq * block_size: the longest row of scores
  int token0;        // the group's first token
  float* scores;     // [group tokens, key_cap]
  // Stage 1's survivors, [group tokens, slices, top_k] each, and how many per slice.
  float* survivor_score;
  int32_t* survivor_pos;
  int32_t* survivor_count;
};

// A thread per key: its index key in registers, 8 dims at a time, against every head's query
// (shared memory; all threads read the same element, a broadcast). Sums in the CPU's order:
// each head's dot over the dims in turn, then the heads in turn.
__global__ void __launch_bounds__(kScoreThreads) dsa_scores_kernel(const DsaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float q_smem[];  // [n_heads, dim], then the heads' weights
  const DsaSelectParams& p = a.p;
  const int token = a.token0 + int(blockIdx.y);
  const int n_keys = min(p.positions[token] + 1, a.key_cap);
  const int key0 = int(blockIdx.x) * kScoreThreads;
  if (key0 >= n_keys) return;
  float* w_smem = q_smem + p.n_heads * p.dim;
  for (int i = int(threadIdx.x); i < p.n_heads * p.dim; i += kScoreThreads)
    q_smem[i] = bf16_to_float(p.q[int64_t(token) * p.n_heads * p.dim + i]);
  for (int h = int(threadIdx.x); h < p.n_heads; h += kScoreThreads)
    w_smem[h] = p.weights[int64_t(token) * p.n_heads + h] * p.weight_scale;
  __syncthreads();
  const int key = key0 + int(threadIdx.x);
  if (key >= n_keys) return;
  const int seq = sequence_of(p.seq_starts, p.n_seqs, token);
  const uint16_t* k =
      p.index_k + int64_t(cache_slot(p.block_tables, p.max_blocks_per_seq, p.block_size, seq, key)) * p.dim;
  float dot[kMaxIndexHeads];
#pragma unroll
  for (int h = 0; h < kMaxIndexHeads; ++h) dot[h] = 0.0f;
  for (int d0 = 0; d0 < p.dim; d0 += 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(k + d0);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    float kv[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      kv[2 * j] = __uint_as_float(words[j] << 16);
      kv[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    }
#pragma unroll
    for (int h = 0; h < kMaxIndexHeads; ++h) {
      if (h >= p.n_heads) break;
      const float* qh = q_smem + h * p.dim + d0;
#pragma unroll
      for (int j = 0; j < 8; ++j) dot[h] += qh[j] * kv[j];
    }
  }
  float score = 0.0f;
#pragma unroll
  for (int h = 0; h < kMaxIndexHeads; ++h)
    if (h < p.n_heads) score += fmaxf(0.0f, dot[h] * p.q_scale) * w_smem[h];
  a.scores[int64_t(blockIdx.y) * a.key_cap + key] = score;
}

// The same scores on the tensor cores, for up to 8 kNTiles heads and 16 kKSteps dims (GLM-5:
// 32 heads of 128). A warp takes 16 keys at a time, kScoreThreads / 4 a warp, as the A operand
// of m16n8k16 (keys x dims) against Q as B (dims x heads), whose fragments stay in registers for
// the block. The dims of a k-step are permuted alike in A and B (thread t4 holds the 16-byte
// chunks t4, t4 + 4, ... of each row, two k-steps a chunk), so each row is read in whole 16-byte
// pieces; a dot product does not care in which order its dims come. Each thread then sums its
// 2 heads of every n-tile, relu'd and weighted, and the quad adds its 4 partial sums: a sum in
// another order than the CPU's, so scores differ from it by f32 roundings.
template <int kNTiles, int kKSteps>
__global__ void __launch_bounds__(128) dsa_scores_mma_kernel(const DsaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kChunks = kKSteps / 2;  // 16-byte chunks a thread holds of a row
  constexpr int kGroups = kScoreThreads / 4 / 16;
  const DsaSelectParams& p = a.p;
  const int token = a.token0 + int(blockIdx.y);
  const int n_keys = min(p.positions[token] + 1, a.key_cap);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t4 = lane % 4;
  const int key0 = int(blockIdx.x) * kScoreThreads + warp * (kScoreThreads / 4);
  if (key0 >= n_keys) return;
  uint4 qv[kNTiles][kChunks];
  float w[kNTiles][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const int head = nt * 8 + g;
    const uint4* q = reinterpret_cast<const uint4*>(p.q + (int64_t(token) * p.n_heads + head) * p.dim);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) qv[nt][j] = head < p.n_heads ? q[t4 + 4 * j] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = nt * 8 + 2 * t4 + e;
      w[nt][e] = h < p.n_heads ? p.weights[int64_t(token) * p.n_heads + h] * p.weight_scale : 0.0f;
    }
  }
  const int seq = sequence_of(p.seq_starts, p.n_seqs, token);
  float* out = a.scores + int64_t(blockIdx.y) * a.key_cap;
#pragma unroll 1
  for (int grp = 0; grp < kGroups; ++grp) {
    const int base = key0 + grp * 16;
    if (base >= n_keys) break;
    uint4 kv[2][kChunks];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = base + g + 8 * r;
      const bool valid = key < n_keys;
      const uint4* k = reinterpret_cast<const uint4*>(
          p.index_k +
          (valid ? int64_t(cache_slot(p.block_tables, p.max_blocks_per_seq, p.block_size, seq, key)) * p.dim : 0));
#pragma unroll
      for (int j = 0; j < kChunks; ++j) kv[r][j] = valid ? k[t4 + 4 * j] : make_uint4(0, 0, 0, 0);
    }
    float d[kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t a_frag[4] = {word(kv[0][j], 2 * e), word(kv[1][j], 2 * e), word(kv[0][j], 2 * e + 1),
                                    word(kv[1][j], 2 * e + 1)};
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          mma_bf16_16x8x16(d[nt], a_frag, word(qv[nt][j], 2 * e), word(qv[nt][j], 2 * e + 1));
      }
    float score[2] = {0.0f, 0.0f};  // keys g and g + 8
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) score[r] += fmaxf(0.0f, d[nt][2 * r + e] * p.q_scale) * w[nt][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      score[r] = quad_sum(score[r]);
      const int key = base + g + 8 * r;
      if (t4 == r && key < n_keys) out[key] = score[r];
    }
  }
}

// Larger floats give larger keys (negative ones flipped whole, positive ones above them).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

// Stage 1 reads a slice of a token's scores; stage 2 the slices' survivors, slice c's
// count[c] of them at c * top_k, indexed as if packed end to end: in both, index order is
// position order.
struct ScoreSlice {
  const float* scores;
  int begin, end;
  __device__ int size() const { return end - begin; }
  __device__ bool get(int i, float& score, int32_t& pos) const {
    score = scores[begin + i];
    pos = begin + i;
    return true;
  }
};
struct Survivors {
  const float* scores;
  const int32_t* positions;
  const int* starts;  // [n_slices + 1]: where each slice's survivors begin, packed (shared memory)
  int top_k, n_slices;
  __device__ int size() const { return starts[n_slices]; }
  __device__ bool get(int i, float& score, int32_t& pos) const {
    int c = 0;
    while (starts[c + 1] <= i) ++c;
    const int at = c * top_k + (i - starts[c]);
    score = scores[at];
    pos = positions[at];
    return true;
  }
};

// The block's top_k of `src` (score first, then the lower position), written in index order:
// positions to out_pos, scores to out_score (when given); returns how many (all of them when
// there are no more than top_k). A radix select, 8 bits a pass from the top, finds the top_k-th
// largest key; then the keys above it and the first of its ties are written, placed by a
// block-wide scan.
template <class Src>
__device__ int block_top_k(const Src& src, int top_k, int32_t* out_pos, float* out_score) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int histogram[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_chunk_total;
  const int tid = int(threadIdx.x), n = src.size();
  uint32_t prefix = 0, mask = 0;
  if (tid == 0) s_remaining = top_k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kSelectThreads) histogram[i] = 0;
    __syncthreads();
    // Scores bunch in a few top bytes, and every thread adding 1 to the same bin serializes:
    // a thread counts a run of its keys with one digit and adds the run once.
    int run_digit = -1, run = 0;
    for (int j = tid; j < n; j += kSelectThreads) {
      float score;
      int32_t pos;
      if (!src.get(j, score, pos)) continue;
      const uint32_t k = order_key(score);
      if ((k & mask) != prefix) continue;
      const int digit = int((k >> shift) & 0xff);
      if (digit == run_digit) {
        ++run;
        continue;
      }
      if (run > 0) atomicAdd(&histogram[run_digit], run);
      run_digit = digit;
      run = 1;
    }
    if (run > 0) atomicAdd(&histogram[run_digit], run);
    __syncthreads();
    if (tid < 32) {
      // The digit where the count from the top reaches the keys still wanted, found by warp 0:
      // lane l holds digits 255 - 8l down to 248 - 8l, a scan gives the keys above its own.
      // With fewer keys than wanted the last lane takes digit 0, and then all of them are taken.
      const int lane = tid, wanted = s_remaining;
      int count[8], sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += (count[i] = histogram[255 - 8 * lane - i]);
      int upto = sum;  // keys at this lane's digits and above
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, upto, o);
        if (lane >= o) upto += v;
      }
      const int total = __shfl_sync(0xffffffffu, upto, 31);
      int above = upto - sum;
      if ((above < wanted && wanted <= upto) || (lane == 31 && total < wanted)) {
        int i = 0;
        for (; i < 7 && above + count[i] < wanted; ++i) above += count[i];
        s_remaining = wanted - above;
        s_prefix = prefix | (uint32_t(255 - 8 * lane - i) << shift);
      }
    }
    __syncthreads();
    prefix = s_prefix;
    mask |= 0xffu << shift;
  }
  const uint32_t threshold = prefix;
  const int ties_wanted = s_remaining;
  // The scan counts both kinds in one int: above in the low 16 bits, ties in the high ones.
  int written = 0, ties_seen = 0;
  for (int base = 0; base < n; base += kSelectThreads) {
    const int j = base + tid;
    float score = 0.0f;
    int32_t pos = -1;
    const bool valid = j < n && src.get(j, score, pos);
    const uint32_t k = order_key(score);
    const int above = valid && k > threshold, tie = valid && k == threshold;
    int before = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(above | (tie << 16), before, total);
    const int ties_before = ties_seen + (before >> 16);
    if (above || (tie && ties_before < ties_wanted)) {
      const int at = written + (before & 0xffff) + min(before >> 16, max(0, ties_wanted - ties_seen));
      out_pos[at] = pos;
      if (out_score) out_score[at] = score;
    }
    if (tid == 0) s_chunk_total = total;
    __syncthreads();
    const int chunk_total = s_chunk_total;
    written += (chunk_total & 0xffff) + min(chunk_total >> 16, max(0, ties_wanted - ties_seen));
    ties_seen += chunk_total >> 16;
    __syncthreads();  // the scan storage and s_chunk_total are reused
  }
  return written;
}

// Stage 1, a block per (slice of kSliceKeys keys, token): the slice's top_k survive. A token's
// global top_k is among its slices' (a key beaten by top_k others in its slice is beaten by
// them overall). Slices past the token's keys survive nothing.
__global__ void __launch_bounds__(kSelectThreads) dsa_slice_top_k_kernel(const DsaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = int(blockIdx.y), slice = int(blockIdx.x), n_slices = int(gridDim.x);
  const int n_keys = min(a.p.positions[a.token0 + t] + 1, a.key_cap);
  const int64_t row = int64_t(t) * n_slices + slice;
  const ScoreSlice src{a.scores + int64_t(t) * a.key_cap, min(slice * kSliceKeys, n_keys),
                       min((slice + 1) * kSliceKeys, n_keys)};
  const int n = block_top_k(src, a.p.top_k, a.survivor_pos + row * a.p.top_k, a.survivor_score + row * a.p.top_k);
  if (threadIdx.x == 0) a.survivor_count[row] = n;
}

// Stage 2, a block per token: the top_k of its slices' survivors, then -1s. No more survivors
// than top_k (a context of one slice, or under top_k keys): they are the answer, in order.
__global__ void __launch_bounds__(kSelectThreads) dsa_final_top_k_kernel(const DsaArgs a, int n_slices) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ int starts[kMaxSlices + 1];
  const int t = int(blockIdx.x), token = a.token0 + t;
  const int64_t first = int64_t(t) * n_slices;
  if (threadIdx.x == 0) {
    starts[0] = 0;
    for (int c = 0; c < n_slices; ++c) starts[c + 1] = starts[c] + a.survivor_count[first + c];
  }
  __syncthreads();
  const Survivors src{a.survivor_score + first * a.p.top_k, a.survivor_pos + first * a.p.top_k, starts, a.p.top_k,
                      n_slices};
  int32_t* out = a.p.selected + int64_t(token) * a.p.top_k;
  int n = src.size();
  if (n <= a.p.top_k) {
    for (int j = int(threadIdx.x); j < n; j += kSelectThreads) {
      float score;
      src.get(j, score, out[j]);
    }
  } else {
    n = block_top_k(src, a.p.top_k, out, nullptr);
  }
  for (int j = n + int(threadIdx.x); j < a.p.top_k; j += kSelectThreads) out[j] = -1;
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
    launch_kernel(launch, mla_fallback_kernel, unsigned(n_blocks), kFallbackWarps * 32, 0, a);
    TETRA_CUDA_CHECK_LAUNCH("mla_attention fallback");
    return;
  }
  const dim3 grid(unsigned(plan.n_row_tiles) * unsigned(plan.n_splits),
                  unsigned(p.selected ? p.n_tokens : p.n_seqs));
  if (plan.path == MlaAttentionPath::Wgmma) {
    launch_mla_wgmma(launch, a, grid);
  } else {
    static const bool raised = [] {  // once per process (for the current device)
      TETRA_CUDA_CHECK(cudaFuncSetAttribute(tiled::mla_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            tiled::kSmemBytes));
      return true;
    }();
    (void)raised;
    launch_kernel(launch, tiled::mla_tiled_kernel, grid, tiled::kThreads, tiled::kSmemBytes, a);
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

namespace {
// What one token takes of the workspace: its scores, and its slices' survivors (score, position)
// with their counts.
struct DsaLayout {
  int64_t cap, n_slices, token_bytes;
  int group;  // tokens scored and selected at a time
};

DsaLayout dsa_layout(const DsaSelectParams& p) {
  DsaLayout l;
  l.cap = int64_t(p.max_blocks_per_seq) * p.block_size;
  l.n_slices = ceil_div(l.cap, kSliceKeys);
  l.token_bytes = ceil_div(l.cap * 4 + l.n_slices * (int64_t(p.top_k) * 8 + 4), 16) * 16;
  l.group = int(std::clamp<int64_t>(kScoreWorkspaceBytes / l.token_bytes, 1, std::max(p.n_tokens, 1)));
  return l;
}
}  // namespace

int64_t dsa_select_workspace_bytes(const DsaSelectParams& p) {
  if (p.n_tokens == 0) return 0;
  const DsaLayout l = dsa_layout(p);
  return int64_t(l.group) * l.token_bytes;
}

void dsa_select(const KernelLaunch& launch, const DsaSelectParams& p, void* workspace, int64_t workspace_size) {
  if (p.n_tokens == 0) return;
  TETRA_CHECK(p.n_heads >= 1 && p.n_heads <= kMaxIndexHeads, "dsa_select: ", p.n_heads,
              " index heads; the CUDA kernel takes 1..", kMaxIndexHeads);
  TETRA_CHECK(p.dim >= 8 && p.dim % 8 == 0 && aligned16(p.index_k),
              "dsa_select: index keys of ", p.dim, " values must be whole 16-byte rows");
  TETRA_CHECK(p.top_k >= 1 && p.top_k <= kSliceKeys && p.n_seqs >= 1 && p.block_size >= 1 &&
                  p.max_blocks_per_seq >= 1,
              "dsa_select: top_k ", p.top_k, " (at most ", kSliceKeys, "), ", p.n_seqs, " sequences");
  TETRA_CHECK(p.q && p.weights && p.index_k && p.selected && p.positions && p.seq_starts && p.block_tables,
              "dsa_select: a tensor pointer is null");
  const DsaLayout l = dsa_layout(p);
  TETRA_CHECK(l.cap <= INT_MAX && l.n_slices <= kMaxSlices, "dsa_select: a context of ", l.cap, " keys is too long");
  const int64_t need = int64_t(l.group) * l.token_bytes;
  TETRA_CHECK(workspace && workspace_size >= need && aligned16(workspace), "dsa_select: needs ", need,
              " bytes of 16-byte aligned workspace, got ", workspace_size);
  const int smem = (p.n_heads * p.dim + p.n_heads) * int(sizeof(float));
  TETRA_CHECK(smem <= 48 * 1024, "dsa_select: ", p.n_heads, " heads of ", p.dim, " values do not fit shared memory");
  // The group's scores, then its survivors: scores, positions, counts.
  auto* base = static_cast<uint8_t*>(workspace);
  const int64_t survivors = int64_t(l.group) * l.n_slices * p.top_k;
  DsaArgs a{p, int(l.cap), 0, reinterpret_cast<float*>(base), nullptr, nullptr, nullptr};
  a.survivor_score = reinterpret_cast<float*>(base + int64_t(l.group) * l.cap * 4);
  a.survivor_pos = reinterpret_cast<int32_t*>(a.survivor_score + survivors);
  a.survivor_count = a.survivor_pos + survivors;
  // The tensor-core scores for GLM-5's indexer (32 heads of 128 dims) and the small fixtures'
  // indexers (8 heads of 32); a thread a key on the CUDA cores otherwise.
  void (*scores_mma)(DsaArgs) = nullptr;
  if (aligned16(p.q) && p.n_heads > 24 && p.n_heads <= 32 && p.dim == 128) scores_mma = dsa_scores_mma_kernel<4, 8>;
  if (aligned16(p.q) && p.n_heads <= 8 && p.dim == 32) scores_mma = dsa_scores_mma_kernel<1, 2>;
  for (int t0 = 0; t0 < p.n_tokens; t0 += l.group) {
    const int n = std::min(l.group, p.n_tokens - t0);
    a.token0 = t0;
    const dim3 grid(unsigned(ceil_div(l.cap, kScoreThreads)), unsigned(n));
    if (scores_mma) {
      launch_kernel(launch, scores_mma, grid, 128, 0, a);
    } else {
      launch_kernel(launch, dsa_scores_kernel, grid, kScoreThreads, smem, a);
    }
    TETRA_CUDA_CHECK_LAUNCH("dsa_select scores");
    launch_kernel(launch, dsa_slice_top_k_kernel, dim3(unsigned(l.n_slices), unsigned(n)), kSelectThreads, 0, a);
    TETRA_CUDA_CHECK_LAUNCH("dsa_select slice top-k");
    launch_kernel(launch, dsa_final_top_k_kernel, unsigned(n), kSelectThreads, 0, a, int(l.n_slices));
    TETRA_CUDA_CHECK_LAUNCH("dsa_select top-k");
  }
}

}  // namespace tetra::ops::cuda
