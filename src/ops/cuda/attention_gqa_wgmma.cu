// Causal GQA prefill attention on wgmma (sm_90a): paged_attention's PrefillWgmma path, a BF16
// cache and head dim 128 (attention_gqa.h).
//
// The mma.sync prefill kernel runs at about 43% of the SM's tensor rate, bound by its operand
// traffic: every warp re-reads Q and each K/V tile through ldmatrix into registers. Here the
// tensor cores read Q, K and V from shared memory themselves, and P never leaves registers,
// as FlashAttention-3 does:
//   - a block is 128 packed query rows (token-major (token, head) pairs of one sequence and KV
//     head, as in the mma.sync kernels), two warpgroups of 64; Q and two stages of 64-key K and
//     V tiles sit in shared memory, 128-byte swizzled, filled by cp.async (keys gathered by
//     slot, the slots found a tile ahead);
//   - per tile, each warpgroup scores S = Q K^T (8 k-steps of m64n64k16), runs the online
//     softmax in its accumulators, and adds O += P V with P as the A operand from registers
//     (4 k-steps of m64n128k16, V read MN-major);
//   - two blocks an SM: one block's softmax and copies run while the other's MMAs do.
// A row's reference maximum moves only when a tile beats it by more than kRescaleSlack, so O's
// rescale is skipped in most tiles. Splits leave (max, sum, unnormalized output) for
// attention_gqa.cu's combine kernel, as the mma.sync kernels do.
#include <cuda_bf16.h>

#include <climits>

#include "ops/cuda/attention_gqa_internal.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_sync.cuh"
#include "ops/cuda/wgmma.cuh"

namespace tetra::ops::cuda::gqa {
namespace {

constexpr int kD = kWgmmaHeadDim, kRows = kWgmmaRows, kKeys = kWgmmaKeys;
constexpr int kThreads = 256;  // two warpgroups, 64 rows each
constexpr int kStages = 2;
constexpr int kChunks = kD / 8;                          // 16-byte chunks of a row
constexpr int kQAtomBytes = kRows * 128;                 // 64 dims of every Q row
constexpr int kKvAtomBytes = kKeys * 128;                // 64 dims of every key of a tile
constexpr int kKvBytes = (kD / 64) * kKvAtomBytes;       // a tile's K, or its V
constexpr int kStageOffset = (kD / 64) * kQAtomBytes;    // Q first
constexpr int kStageBytes = 2 * kKvBytes;                // K then V
constexpr int kSlotsOffset = kStageOffset + kStages * kStageBytes;
constexpr int kWarpMaxOffset = kSlotsOffset + kStages * kKeys * 4;
constexpr int kSmemBytes = kWarpMaxOffset + (kThreads / 32) * 4 + 1024;  // + alignment slack
// The softmax keeps a row's reference maximum until a tile beats it by more than this (log2
// units, a factor 256): the weights stay at most 2^8, exact in f32 and as BF16 as any others.
constexpr float kRescaleSlack = 8.0f;
static_assert(kWgmmaBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "two blocks fit an SM");
static_assert(kKeys <= kThreads, "one thread finds each key's slot");
static_assert(kRows * kChunks % kThreads == 0 && kKeys * kChunks % kThreads == 0, "copies divide evenly");

// One block's work: a row tile of one (sequence, KV head), one key split.
struct Work {
  int seq, kv_head, split;
  int token_begin, n_rows, row0;
  int key_begin, key_end;
};

// The cache slot of `key`, or -1 past the split's keys (their block-table entries may be
// garbage and are never read).
__device__ __forceinline__ int slot_or_none(const KernelArgs& a, const Work& w, int key) {
  return key < w.key_end ? slot_of(a, w.seq, key) : -1;
}

// Unit c (16 bytes, dims 8c .. 8c + 7) of row r of a swizzled tile whose 64-dim column blocks
// are `atom_bytes` apart.
__device__ __forceinline__ uint32_t tile_unit(int r, int c, int atom_bytes) {
  return uint32_t((c / 8) * atom_bytes) + wgmma::swizzled(r, c % 8);
}

// Q of the row tile, by all threads; padding rows are zeros.
__device__ __forceinline__ void load_q(const KernelArgs& a, const Work& w, uint32_t q_smem) {
#pragma unroll 2
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = int(threadIdx.x) + i * kThreads, r = idx / kChunks, c = idx % kChunks;
    const int row = w.row0 + r;
    const bool valid = row < w.n_rows;
    const uint16_t* src = a.p.q;
    if (valid) {
      const int token = w.token_begin + row / a.group, head = w.kv_head * a.group + row % a.group;
      src += (int64_t(token) * a.p.n_heads + head) * kD + 8 * c;
    }
    cp_async_16(q_smem + tile_unit(r, c, kQAtomBytes), src, valid);
  }
}

// The K and V rows of a tile's slots, by all threads; rows of slot -1 are zeros.
__device__ __forceinline__ void copy_kv_tile(const KernelArgs& a, const Work& w, const int32_t* slots,
                                             uint32_t k_smem) {
  const uint16_t* k_cache = static_cast<const uint16_t*>(a.p.k_cache);
  const uint16_t* v_cache = static_cast<const uint16_t*>(a.p.v_cache);
#pragma unroll 1
  for (int i = 0; i < kKeys * kChunks / kThreads; ++i) {
    const int idx = int(threadIdx.x) + i * kThreads, r = idx / kChunks, c = idx % kChunks;
    const int slot = slots[r];
    const bool valid = slot >= 0;
    const int64_t offset = valid ? (int64_t(slot) * a.p.n_kv_heads + w.kv_head) * kD + 8 * c : 0;
    const uint32_t dst = k_smem + tile_unit(r, c, kKvAtomBytes);
    cp_async_16(dst, k_cache + offset, valid);
    cp_async_16(dst + kKvBytes, v_cache + offset, valid);
  }
}

// The block's key range: this split's keys, cut at the last position any of its rows has.
__device__ __forceinline__ void key_range(const KernelArgs& a, Work& w, int* warp_max_smem) {
  const int tid = int(threadIdx.x), row = w.row0 + tid % kRows;
  const int position = row < w.n_rows ? a.p.positions[w.token_begin + row / a.group] : -1;
  const int wmax = __reduce_max_sync(0xffffffffu, position);
  if (tid % 32 == 0) warp_max_smem[tid / 32] = wmax;
  __syncthreads();
  int max_position = -1;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) max_position = max(max_position, warp_max_smem[i]);
  const int kv_end = min(max_position + 1, a.key_cap);
  w.key_begin = w.split * a.keys_per_split;
  w.key_end = w.split == a.n_splits - 1 ? kv_end : min(kv_end, w.key_begin + a.keys_per_split);
}

__device__ __forceinline__ void attend_row_tile(const KernelArgs& a, uint8_t* smem, uint32_t base, Work w) {
  const int tid = int(threadIdx.x), wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const uint32_t q_smem = base;
  const auto k_smem = [&](int s) { return base + uint32_t(kStageOffset + s * kStageBytes); };
  const auto slots = [&](int s) { return reinterpret_cast<int32_t*>(smem + kSlotsOffset) + s * kKeys; };
  key_range(a, w, reinterpret_cast<int*>(smem + kWarpMaxOffset));

  // This thread's accumulator rows, 64 wg + 16 warp + g and + 8, and the last key each sees
  // (-1 for padding rows).
  const int row0 = w.row0 + 64 * wg + 16 * warp + g;
  int key_limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    key_limit[r] = row < w.n_rows ? min(a.p.positions[w.token_begin + row / a.group], w.key_end - 1) : -1;
  }
  const int first_limit = min(key_limit[0], key_limit[1]);

  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const int n_tiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + kKeys - 1) / kKeys : 0;
  const auto tile_key = [&](int tile) { return w.key_begin + tile * kKeys + tid; };
  if (n_tiles > 0) {
    if (tid < kKeys) {
      slots(0)[tid] = slot_or_none(a, w, tile_key(0));
      slots(1)[tid] = slot_or_none(a, w, tile_key(1));
    }
    load_q(a, w, q_smem);
    __syncthreads();  // the slots of tiles 0 and 1
    copy_kv_tile(a, w, slots(0), k_smem(0));
    cp_async_commit();  // Q and tile 0
  }
  // Q's rows of this warpgroup, and a k-step's offset into Q and into a K tile.
  const uint32_t q_rows = q_smem + uint32_t(wg * 64 * 128);
  const auto k_step = [](int kk, int atom_bytes) { return uint32_t((kk / 4) * atom_bytes + (kk % 4) * 32); };
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % kStages, next = it + 1;
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    // Tile it landed for every thread; every warpgroup is past tile it - 1's P V, so its stage
    // takes tile it + 1, and the slots stored last iteration are visible.
    __syncthreads();
    if (next < n_tiles) copy_kv_tile(a, w, slots(next % kStages), k_smem(next % kStages));
    cp_async_commit();
    const int ahead_slot = tid < kKeys ? slot_or_none(a, w, tile_key(it + 2)) : -1;

    const uint32_t k_tile = k_smem(stage), v_tile = k_tile + kKvBytes;
    float s[kKeys / 2];
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
    wgmma::fence();
    // A descriptor's address field is addr / 16 in its low 14 bits: a k-step's offset adds to
    // it without a carry (shared memory is below 256 KB).
    const uint64_t q_desc = wgmma::desc_k_major(q_rows), k_desc = wgmma::desc_k_major(k_tile);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma::mma_ss<0>(s, q_desc + k_step(kk, kQAtomBytes) / 16, k_desc + k_step(kk, kKvAtomBytes) / 16);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_acc(s);

    // Accumulator i holds key 8 (i / 4) + 2 t4 + (i & 1) of row (i / 2) & 1.
    const int key0 = w.key_begin + it * kKeys;
    const bool masked = key0 + kKeys - 1 > first_limit;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      const int r = (i / 2) & 1, key = key0 + 8 * (i / 4) + 2 * t4 + (i & 1);
      const float x = masked && key > key_limit[r] ? -INFINITY : s[i] * a.scale_log2;
      s[i] = x;
      tile_max[r] = fmaxf(tile_max[r], x);
    }
    float alpha[2], base_r[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_tile = quad_max(tile_max[r]);
      alpha[r] = 1.0f;
      if (m_tile > m[r] + kRescaleSlack) {  // a row's first key too: m = -inf, alpha = 0
        alpha[r] = exp2_approx(m[r] - m_tile);
        m[r] = m_tile;
      }
      base_r[r] = m[r] == -INFINITY ? 0.0f : m[r];  // no key yet: exp2(-inf - 0) = 0, not NaN
    }
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      const int r = (i / 2) & 1;
      s[i] = exp2_approx(s[i] - base_r[r]);
      tile_sum[r] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + tile_sum[r];
    if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o[i] *= alpha[(i / 2) & 1];
    }
    // P as the A operand of k-step kk (keys 16 kk ..): the accumulators of n-tiles 2 kk and
    // 2 kk + 1 are its rows g, g + 8 at keys 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9.
    uint32_t p[kKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) p[kk][j] = pack_bf16x2(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
    wgmma::fence();
    const uint64_t v_desc = wgmma::desc_mn_major(v_tile, kKvAtomBytes);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::mma_rs_mn(o, p[kk], v_desc + kk * 16 * 128 / 16);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_acc(o);
    // Tile it's slots were used when it was copied: the buffer takes tile it + 2.
    if (tid < kKeys) slots(stage)[tid] = ahead_slot;
  }

  // O's row r, dims 8 j + 2 t4 and + 1, is o[4 j + 2 r] and o[4 j + 2 r + 1].
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    const int row = row0 + 8 * r;
    if (row >= w.n_rows) continue;  // a row with no key (in this split) writes zeros (m = -inf)
    const int64_t out_row = int64_t(w.token_begin + row / a.group) * a.p.n_heads + w.kv_head * a.group + row % a.group;
    if (a.n_splits > 1) {
      const int64_t part = out_row * a.n_splits + w.split;
      float* dst = a.partial_acc + part * kD;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + 2 * t4) = make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
      if (t4 == 0) a.partial_ml[part] = make_float2(m[r], l[r]);
    } else {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      uint16_t* dst = a.p.out + out_row * kD;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t4) = pack_bf16x2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
  }
}

__global__ void __launch_bounds__(kThreads, kWgmmaBlocksPerSm) attention_wgmma_kernel(const KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const int n_heads_splits = a.p.n_kv_heads * a.n_splits;
  const int n_row_tiles = int(gridDim.x) / n_heads_splits;
  Work w;
  w.seq = int(blockIdx.y);
  w.split = int(blockIdx.x) % a.n_splits;
  w.kv_head = (int(blockIdx.x) / a.n_splits) % a.p.n_kv_heads;
  w.token_begin = a.p.seq_starts[w.seq];
  w.n_rows = (a.p.seq_starts[w.seq + 1] - w.token_begin) * a.group;
  // Causal rows: a later row tile has more keys, so the grid starts from the last. Row tiles
  // past the plan's (a sequence longer than max_query_len) are still covered.
  for (int tile = n_row_tiles - 1 - int(blockIdx.x) / n_heads_splits; tile * kRows < w.n_rows; tile += n_row_tiles) {
    w.row0 = tile * kRows;
    attend_row_tile(a, smem, base, w);
    __syncthreads();  // shared memory is reused by the next row tile
  }
}

}  // namespace

void launch_prefill_wgmma(const KernelLaunch& launch, const KernelArgs& a, const PagedAttentionPlan& plan) {
  static const bool raised = [] {  // once per process (for the current device)
    TETRA_CUDA_CHECK(cudaFuncSetAttribute(attention_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)raised;
  const int64_t blocks = int64_t(plan.n_row_tiles) * a.p.n_kv_heads * plan.n_splits;
  TETRA_CHECK(blocks <= INT_MAX, "paged_attention: ", blocks, " blocks is too many");
  launch_kernel(launch, attention_wgmma_kernel, dim3(unsigned(blocks), unsigned(a.p.n_seqs)), kThreads, kSmemBytes, a);
  TETRA_CUDA_CHECK_LAUNCH("paged_attention wgmma");
}

}  // namespace tetra::ops::cuda::gqa
