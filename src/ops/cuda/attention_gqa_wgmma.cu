// Causal GQA prefill attention on wgmma (sm_90a): paged_attention's PrefillWgmma path, head
// dim 128 over a BF16 or an FP8 cache (attention_gqa.h).
//
// The mma.sync prefill kernel runs at about 30% of the tensor rate, bound by its operand
// traffic: every warp re-reads Q and each K/V tile through ldmatrix into registers. Here the
// tensor cores read Q, K and V from shared memory themselves and P never leaves registers, and
// the work is split by role, as FlashAttention-3 does:
//   - a block is 128 packed query rows (token-major (token, head) pairs of one sequence and KV
//     head, as in the mma.sync kernels): two consumer warpgroups of 64 rows, and a producer
//     warpgroup that gives most of its registers to the consumers;
//   - the producer gathers each 128-key tile's K and V rows by slot into a ring of stages
//     (128-byte swizzled BF16), and hands a stage's K and V over through mbarriers once they
//     are filled; the consumers hand each back through others, K once its scores are done, V
//     once its P V is. A BF16 cache's rows are copied straight into the stage by one warp
//     (cp.async); an FP8 cache's bytes are copied by the whole warpgroup into a staging buffer,
//     a tile ahead, and widened into the stage (exact), with the scales in the softmax's (k) and
//     the output's (v) factors;
//   - a consumer warpgroup scores S = Q K^T (8 k-steps of m64n128k16, Q and K from shared
//     memory) and, while the tensor cores add the previous tile's O += P V (P from registers,
//     V read MN-major), runs the online softmax of this one; the two warpgroups take turns
//     to issue their MMAs, so that one's softmax runs beside the other's MMAs.
// A row's reference maximum moves only past a slack (wgmma_softmax.cuh), so O's rescale is
// skipped in most tiles. Splits leave (max, sum, unnormalized output) for
// attention_gqa.cu's combine kernel, as the mma.sync kernels do.
#include <cuda_bf16.h>

#include <climits>

#include "ops/cuda/attention_gqa_internal.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mbarrier.cuh"
#include "ops/cuda/mma_sync.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_softmax.cuh"

namespace tetra::ops::cuda::gqa {
namespace {

constexpr int kD = kWgmmaHeadDim, kRows = kWgmmaRows, kKeys = kWgmmaKeys;
constexpr int kConsumerThreads = 256;               // two warpgroups, 64 rows each
constexpr int kThreads = kConsumerThreads + 128;    // and a producer warpgroup (one warp copies)
// Registers a thread, moved from the producer warpgroup to the consumers (setmaxnreg): O, S
// and P of 64 rows against 128 keys take 160 a consumer thread.
constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
// The block's pool is what the launch bounds give every thread (64K registers over kThreads, in
// 8s); setmaxnreg.inc past it would wait forever.
static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                  (64 * 1024 / kThreads) / 8 * 8 * kThreads,
              "setmaxnreg moves registers within the block's pool");
constexpr int kChunks = kD / 8;                     // 16-byte chunks of a BF16 row
constexpr int kQAtomBytes = kRows * 128;            // 64 dims of every Q row
constexpr int kKvAtomBytes = kKeys * 128;           // 64 dims of every key of a tile
constexpr int kKvBytes = (kD / 64) * kKvAtomBytes;  // a tile's K, or its V
constexpr int kStageOffset = (kD / 64) * kQAtomBytes;  // Q first
constexpr int kStageBytes = 2 * kKvBytes;              // K then V
static_assert(kKeys == 128 && kKeys % 32 == 0, "a producer lane finds kKeys / 32 slots; an FP8 producer thread one");

// Shared memory past the stages: FP8's two staging buffers (a tile's K bytes, then its V
// bytes), the stages' barriers (Bar), the warps' maxima of key_range.
template <bool kFp8>
struct Layout {
  // BF16: the copying warp signals tile it - 1 after issuing tile it, and consumers give tile
  // it - 1's V back only after waiting for tile it's K, so with fewer than 3 stages each would
  // wait on the other. FP8: the producer fills a stage's K and V each once its staged bytes
  // have landed, and signals them at once: two stages, which leaves room for the staging
  // buffers. (tools/wgmma_attention_handshakes.py models both.)
  static constexpr int kStages = kFp8 ? 2 : 3;
  static constexpr int kStagingOffset = kStageOffset + kStages * kStageBytes;
  static constexpr int kStagingBytes = 2 * kKeys * kD;
  static constexpr int kBarOffset = kStagingOffset + (kFp8 ? 2 * kStagingBytes : 0);
  static constexpr int kWarpMaxOffset = kBarOffset + 4 * kStages * 8;
  static constexpr int kSmemBytes = kWarpMaxOffset + (kThreads / 32) * 4 + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "one block fits an SM");
};

// Unit c (16 bytes, dims 8c .. 8c + 7) of row r of a swizzled tile whose 64-dim column blocks
// are `atom_bytes` apart.
__device__ __forceinline__ uint32_t tile_unit(int r, int c, int atom_bytes) {
  return uint32_t((c / 8) * atom_bytes) + wgmma::swizzled(r, c % 8);
}

// A stage's barriers. K and V are handed over and back apart: a tile's K is done with once its
// scores are, its V only after the next tile's scores, when its P V is.
enum class Bar { FullK, FullV, EmptyK, EmptyV };

template <bool kFp8>
__device__ __forceinline__ uint32_t bar(uint32_t base, Bar b, int s) {
  return base + uint32_t(Layout<kFp8>::kBarOffset + 8 * (int(b) * Layout<kFp8>::kStages + s));
}

// The block's key range: this split's keys, cut at the last position any of its rows has.
__device__ __forceinline__ void key_range(const KernelArgs& a, RowTile& w, int* warp_max_smem) {
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

// A warpgroup's register count from here on (all its warps execute it).
template <int kCount, bool kIncrease>
__device__ __forceinline__ void set_max_registers() {
  if constexpr (kIncrease) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kCount));
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kCount));
}

// ---- the producer warp ----

// Lane l's slots: keys l, l + 32, ... of tile `tile`.
struct TileSlots {
  int slot[kKeys / 32];
};

__device__ __forceinline__ TileSlots find_slots(const KernelArgs& a, const RowTile& w, int tile, int lane) {
  TileSlots t;
#pragma unroll
  for (int i = 0; i < kKeys / 32; ++i) t.slot[i] = slot_or_none(a, w, w.key_begin + tile * kKeys + 32 * i + lane);
  return t;
}

// Copies a tile's K and V rows, two rows an instruction (lanes 0-15 and 16-31, a 16-byte chunk
// each: 256 contiguous bytes a row); rows of slot -1 are zeros.
__device__ __forceinline__ void copy_tile(const KernelArgs& a, const RowTile& w, const TileSlots& t, uint32_t k_smem,
                                          int lane) {
  const uint16_t* k_cache = static_cast<const uint16_t*>(a.p.k_cache);
  const uint16_t* v_cache = static_cast<const uint16_t*>(a.p.v_cache);
  const int c = lane % 16;
#pragma unroll
  for (int h = 0; h < kKeys / 32; ++h) {  // rows 32 h .. 32 h + 31: the slots of lanes 0-31 in t.slot[h]
#pragma unroll 4
    for (int i = 0; i < 16; ++i) {
      const int r = 2 * i + lane / 16;
      const int slot = __shfl_sync(0xffffffffu, t.slot[h], r);
      const bool valid = slot >= 0;
      const int64_t offset = valid ? (int64_t(slot) * a.p.n_kv_heads + w.kv_head) * kD + 8 * c : 0;
      const uint32_t dst = k_smem + tile_unit(32 * h + r, c, kKvAtomBytes);
      cp_async_16(dst, k_cache + offset, valid);
      cp_async_16(dst + kKvBytes, v_cache + offset, valid);
    }
  }
}

// Tile `tile`'s copies (this lane's, and through __syncwarp every lane's) have landed: made
// visible to the tensor cores' reads and handed to the consumers.
__device__ __forceinline__ void hand_over(uint32_t base, int tile, int lane) {
  wgmma::fence_proxy_async();
  __syncwarp();
  if (lane == 0) {
    const int stage = tile % Layout<false>::kStages;
    mbarrier::arrive(bar<false>(base, Bar::FullK, stage));
    mbarrier::arrive(bar<false>(base, Bar::FullV, stage));
  }
}

// A BF16 cache: one warp copies the rows into the stages.
__device__ __forceinline__ void produce_bf16(const KernelArgs& a, const RowTile& w, uint32_t base, int n_tiles, int lane) {
  constexpr int kStages = Layout<false>::kStages;
  if (n_tiles == 0) return;
  TileSlots slots = find_slots(a, w, 0, lane);
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % kStages;
    if (it >= kStages) {
      mbarrier::wait(bar<false>(base, Bar::EmptyK, stage), uint32_t((it / kStages - 1) & 1));
      mbarrier::wait(bar<false>(base, Bar::EmptyV, stage), uint32_t((it / kStages - 1) & 1));
    }
    copy_tile(a, w, slots, base + uint32_t(kStageOffset + stage * kStageBytes), lane);
    cp_async_commit();
    if (it + 1 < n_tiles) slots = find_slots(a, w, it + 1, lane);  // in flight across the wait below
    if (it > 0) {
      cp_async_wait<1>();
      hand_over(base, it - 1, lane);
    }
  }
  cp_async_wait<0>();
  hand_over(base, n_tiles - 1, lane);
}

__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 5, 128;" ::: "memory"); }

// An FP8 tile's K and V bytes into a staging buffer, by the producer warpgroup (t: its thread):
// each warp the rows of its 32 keys, four rows an instruction (a lane a 16-byte chunk, a row's
// 128 bytes contiguous); rows of slot -1 are zeros.
__device__ __forceinline__ void stage_fp8_tile(const KernelArgs& a, const RowTile& w, int tile, uint32_t staging, int t) {
  const uint8_t* k_cache = static_cast<const uint8_t*>(a.p.k_cache);
  const uint8_t* v_cache = static_cast<const uint8_t*>(a.p.v_cache);
  const int lane = t % 32, warp_row0 = t - lane, c = lane % 8;
  const int my_slot = slot_or_none(a, w, w.key_begin + tile * kKeys + t);  // key t of the tile
#pragma unroll 4
  for (int i = 0; i < 8; ++i) {
    const int r = warp_row0 + 4 * i + lane / 8;
    const int slot = __shfl_sync(0xffffffffu, my_slot, 4 * i + lane / 8);
    const bool valid = slot >= 0;
    const int64_t offset = valid ? (int64_t(slot) * a.p.n_kv_heads + w.kv_head) * kD + 16 * c : 0;
    const uint32_t dst = staging + uint32_t(r * kD + 16 * c);
    cp_async_16(dst, k_cache + offset, valid);
    cp_async_16(dst + kKeys * kD, v_cache + offset, valid);
  }
}

// One part (K or V) of a staged FP8 tile widened into the stage's BF16 tile of it (exact), by the
// producer warpgroup: 16-byte chunk c of row r (16 values) becomes units 2c and 2c + 1 of the
// swizzled row.
__device__ __forceinline__ void widen_fp8_part(const uint8_t* staged, uint32_t tile, int t) {
  constexpr int kRowChunks = kD / 16, kPartChunks = kKeys * kRowChunks;
#pragma unroll 4
  for (int i = 0; i < kPartChunks / 128; ++i) {
    const int q = t + 128 * i, r = q / kRowChunks, c = q % kRowChunks;
    uint32_t out[8];
    widen_e4m3x16(*reinterpret_cast<const uint4*>(staged + r * kD + 16 * c), out);
    st_shared_16(tile + tile_unit(r, 2 * c, kKvAtomBytes), out[0], out[1], out[2], out[3]);
    st_shared_16(tile + tile_unit(r, 2 * c + 1, kKvAtomBytes), out[4], out[5], out[6], out[7]);
  }
}

// An FP8 cache: the producer warpgroup stages tile it + 1's bytes while it widens tile it, K
// then V, each as soon as the consumers have given that part of the stage back.
__device__ __forceinline__ void produce_fp8(const KernelArgs& a, const RowTile& w, uint32_t base, uint8_t* smem,
                                            int n_tiles, int t) {
  using L = Layout<true>;
  if (n_tiles == 0) return;
  const auto staging = [&](int b) { return uint32_t(L::kStagingOffset + b * L::kStagingBytes); };
  stage_fp8_tile(a, w, 0, base + staging(0), t);
  cp_async_commit();
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it % L::kStages;
    if (it + 1 < n_tiles) {  // its buffer held tile it - 1, widened last iteration
      stage_fp8_tile(a, w, it + 1, base + staging((it + 1) % 2), t);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    producer_sync();  // every thread's bytes of tile it have landed
    const uint32_t parity = uint32_t((it / L::kStages - 1) & 1);
    const uint32_t k_tile = base + uint32_t(kStageOffset + stage * kStageBytes);
#pragma unroll
    for (int part = 0; part < 2; ++part) {  // K, then V
      if (it >= L::kStages) mbarrier::wait(bar<true>(base, part ? Bar::EmptyV : Bar::EmptyK, stage), parity);
      widen_fp8_part(smem + staging(it % 2) + part * kKeys * kD, k_tile + uint32_t(part * kKvBytes), t);
      wgmma::fence_proxy_async();
      producer_sync();  // the part is widened (after V: the staging buffer is free for tile it + 2)
      if (t == 0) mbarrier::arrive(bar<true>(base, part ? Bar::FullV : Bar::FullK, stage));
    }
  }
}

// ---- the consumer warpgroups ----

__device__ __forceinline__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
}

// The two consumer warpgroups take turns to issue their MMAs (FlashAttention-3's ping-pong):
// one's softmax runs while the other's MMAs do. Warpgroup wg waits on barrier 3 + wg for its
// turn and, having issued, gives the turn to the other; warpgroup 1 gives warpgroup 0 the
// first turn, and does not give one after its last issue, so the counts match.
__device__ __forceinline__ void wait_turn(int wg) {
  asm volatile("bar.sync %0, 256;" ::"r"(3 + wg) : "memory");
}
__device__ __forceinline__ void give_turn(int wg) {
  asm volatile("bar.arrive %0, 256;" ::"r"(3 + (1 - wg)) : "memory");
}

// The warpgroup's 64 Q rows, by its 128 threads; padding rows are zeros.
__device__ __forceinline__ void load_q(const KernelArgs& a, const RowTile& w, uint32_t q_smem, int wg, int t) {
  constexpr int kPerThread = 64 * kChunks / 128;
#pragma unroll 2
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = t + i * 128, r = 64 * wg + idx / kChunks, c = idx % kChunks;
    const int row = w.row0 + r;
    const bool valid = row < w.n_rows;
    const uint16_t* src = a.p.q;
    if (valid) {
      const int token = w.token_begin + row / a.group, head = w.kv_head * a.group + row % a.group;
      src += (int64_t(token) * a.p.n_heads + head) * kD + 8 * c;
    }
    cp_async_16(q_smem + tile_unit(r, c, kQAtomBytes), src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  wgmma::fence_proxy_async();
  warpgroup_sync(wg);
}

// A warpgroup's running softmax: this thread's two rows (g and g + 8 of its warp's 16).
struct RowState {
  int key_limit[2];  // the last key a row sees in this split; -1 for padding rows
  int first_limit;   // the smaller: a tile past it needs the mask
  float m[2], l[2];  // reference max (log2 units, -inf before any key); this lane's share of the sum
};

// Scores of a tile to p = exp2(score - reference max) in place; returns each row's factor for
// O (1 unless the reference moved), and updates the sums.
__device__ __forceinline__ float2 softmax_tile(const KernelArgs& a, int key0, int t4, float (&s)[kKeys / 2],
                                               RowState& st) {
  // Accumulator i holds key 8 (i / 4) + 2 t4 + (i & 1) of row (i / 2) & 1.
  const bool masked = key0 + kKeys - 1 > st.first_limit;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) {
    const int r = (i / 2) & 1, key = key0 + 8 * (i / 4) + 2 * t4 + (i & 1);
    const float x = masked && key > st.key_limit[r] ? -INFINITY : s[i] * a.scale_log2;
    s[i] = x;
    tile_max[r] = fmaxf(tile_max[r], x);
  }
  return wgmma::softmax_tile(s, tile_max, st.m, st.l);
}

// P as the A operand of k-step kk (keys 16 kk ..): the accumulators of n-tiles 2 kk and 2 kk + 1
// are its rows g, g + 8 at keys 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9.
__device__ __forceinline__ void pack_p(const float (&s)[kKeys / 2], uint32_t (&p)[kKeys / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) p[kk][j] = pack_bf16x2(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
}

__device__ __forceinline__ void rescale(float (&o)[kD / 2], float2 alpha) {
  if (__all_sync(0xffffffffu, alpha.x == 1.0f && alpha.y == 1.0f)) return;
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] *= (i / 2) & 1 ? alpha.y : alpha.x;
}

// S = Q K^T of the tile in `stage`, issued (one wgmma group).
__device__ __forceinline__ void issue_scores(uint32_t q_rows, uint32_t base, int stage, float (&s)[kKeys / 2]) {
  // A descriptor's address field is addr / 16 in its low 14 bits: a k-step's offset adds to it
  // without a carry (shared memory is below 256 KB).
  const uint64_t q_desc = wgmma::desc_k_major(q_rows);
  const uint64_t k_desc = wgmma::desc_k_major(base + uint32_t(kStageOffset + stage * kStageBytes));
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t q_step = (kk / 4) * kQAtomBytes + (kk % 4) * 32, k_step = (kk / 4) * kKvAtomBytes + (kk % 4) * 32;
    wgmma::mma_ss<0>(s, q_desc + q_step / 16, k_desc + k_step / 16);
  }
  wgmma::commit();
}

// O += P V of the tile in `stage`, issued (one wgmma group).
__device__ __forceinline__ void issue_pv(const uint32_t (&p)[kKeys / 16][4], uint32_t base, int stage, float (&o)[kD / 2]) {
  const uint64_t v_desc = wgmma::desc_mn_major(base + uint32_t(kStageOffset + stage * kStageBytes + kKvBytes), kKvAtomBytes);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) wgmma::mma_rs_mn(o, p[kk], v_desc + kk * 16 * 128 / 16);
  wgmma::commit();
}

// This warp is done with a part of a stage (its wgmma groups that read it have completed).
template <bool kFp8>
__device__ __forceinline__ void give_back(uint32_t base, Bar part, int stage, int lane) {
  __syncwarp();
  if (lane == 0) mbarrier::arrive(bar<kFp8>(base, part, stage));
}

template <bool kFp8>
__device__ __forceinline__ void consume(const KernelArgs& a, const RowTile& w, uint32_t base, int n_tiles, int wg,
                                        int warp, int lane) {
  constexpr int kStages = Layout<kFp8>::kStages;
  const int g = lane / 4, t4 = lane % 4;
  const int row0 = w.row0 + 64 * wg + 16 * warp + g;  // this thread's rows: row0 and row0 + 8
  RowState st;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    st.key_limit[r] = row < w.n_rows ? min(a.p.positions[w.token_begin + row / a.group], w.key_end - 1) : -1;
    st.m[r] = -INFINITY;
    st.l[r] = 0.0f;
  }
  st.first_limit = min(st.key_limit[0], st.key_limit[1]);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;

  if (n_tiles > 0) {
    load_q(a, w, base, wg, 128 * wg + 32 * warp + lane);
    const uint32_t q_rows = base + uint32_t(wg * 64 * 128);
    float s[kKeys / 2];
    uint32_t p[kKeys / 16][4];
    if (wg == 1) give_turn(wg);
    // Tile 0: scores and softmax alone.
    mbarrier::wait(bar<kFp8>(base, Bar::FullK, 0), 0);
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
    wait_turn(wg);
    wgmma::fence();
    issue_scores(q_rows, base, 0, s);
    give_turn(wg);
    wgmma::wait<0>();
    wgmma::fence_acc(s);
    give_back<kFp8>(base, Bar::EmptyK, 0, lane);
    softmax_tile(a, w.key_begin, t4, s, st);  // O is still zero: nothing to rescale
    pack_p(s, p);
    // Tile it's scores and softmax run beside tile it - 1's P V.
    for (int it = 1; it < n_tiles; ++it) {
      const int stage = it % kStages, prev = (it - 1) % kStages;
      mbarrier::wait(bar<kFp8>(base, Bar::FullK, stage), uint32_t((it / kStages) & 1));
      mbarrier::wait(bar<kFp8>(base, Bar::FullV, prev), uint32_t(((it - 1) / kStages) & 1));
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
      wgmma::fence_acc(o);
      wait_turn(wg);
      wgmma::fence();
      issue_scores(q_rows, base, stage, s);
      issue_pv(p, base, prev, o);
      give_turn(wg);
      wgmma::fence_acc(o);
      wgmma::wait<1>();  // the scores; P V may still run
      wgmma::fence_acc(s);
      give_back<kFp8>(base, Bar::EmptyK, stage, lane);
      const float2 alpha = softmax_tile(a, w.key_begin + it * kKeys, t4, s, st);
      wgmma::wait<0>();
      wgmma::fence_acc(o);
      give_back<kFp8>(base, Bar::EmptyV, prev, lane);
      rescale(o, alpha);
      pack_p(s, p);
    }
    const int last = (n_tiles - 1) % kStages;
    mbarrier::wait(bar<kFp8>(base, Bar::FullV, last), uint32_t(((n_tiles - 1) / kStages) & 1));
    wgmma::fence_acc(o);
    wait_turn(wg);
    wgmma::fence();
    issue_pv(p, base, last, o);
    if (wg == 0) give_turn(wg);
    wgmma::wait<0>();
    wgmma::fence_acc(o);
    give_back<kFp8>(base, Bar::EmptyV, last, lane);
  }

  // O's row r, dims 8 j + 2 t4 and + 1, is o[4 j + 2 r] and o[4 j + 2 r + 1]; an FP8 cache's V
  // values are v / v_scale (v_scale is 1 for BF16).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(st.l[r]);
    const int row = row0 + 8 * r;
    if (row >= w.n_rows) continue;  // a row with no key (in this split) writes zeros (m = -inf)
    const int64_t out_row = int64_t(w.token_begin + row / a.group) * a.p.n_heads + w.kv_head * a.group + row % a.group;
    if (a.n_splits > 1) {
      const int64_t part = out_row * a.n_splits + w.split;
      float* dst = a.partial_acc + part * kD;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + 2 * t4) =
            make_float2(o[4 * j + 2 * r] * a.v_scale, o[4 * j + 2 * r + 1] * a.v_scale);
      if (t4 == 0) a.partial_ml[part] = make_float2(st.m[r], l);
    } else {
      const float inv = l > 0.0f ? a.v_scale / l : 0.0f;
      uint16_t* dst = a.p.out + out_row * kD;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t4) = pack_bf16x2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
  }
}

// Role 0: consumer warpgroups; 1: the producer (a BF16 cache's copying warp, or an FP8 cache's
// whole warpgroup); 2: a BF16 producer warpgroup's other warps, which only keep the block's
// barriers. Each role runs its own loop over the block's row tiles (the same barriers in the
// same order), so that the registers a role is given hold for all of its code.
template <int kRole, bool kFp8>
__device__ __forceinline__ void row_tiles(const KernelArgs& a, uint32_t base, uint8_t* smem, int warp, int lane) {
  using L = Layout<kFp8>;
  const int n_heads_splits = a.p.n_kv_heads * a.n_splits;
  const int n_row_tiles = int(gridDim.x) / n_heads_splits;
  RowTile w;
  w.seq = int(blockIdx.y);
  w.split = int(blockIdx.x) % a.n_splits;
  w.kv_head = (int(blockIdx.x) / a.n_splits) % a.p.n_kv_heads;
  w.token_begin = a.p.seq_starts[w.seq];
  w.n_rows = (a.p.seq_starts[w.seq + 1] - w.token_begin) * a.group;
  // Causal rows: a later row tile has more keys, so the grid starts from the last. Row tiles
  // past the plan's (a sequence longer than max_query_len) are still covered.
  for (int tile = n_row_tiles - 1 - int(blockIdx.x) / n_heads_splits; tile * kRows < w.n_rows; tile += n_row_tiles) {
    w.row0 = tile * kRows;
    if (kRole == 0 && threadIdx.x == 0) {  // fresh barriers for this row tile (the last one's are idle)
      for (int s = 0; s < L::kStages; ++s) {
        mbarrier::init(bar<kFp8>(base, Bar::FullK, s), 1);  // the producer's thread 0
        mbarrier::init(bar<kFp8>(base, Bar::FullV, s), 1);
        mbarrier::init(bar<kFp8>(base, Bar::EmptyK, s), kConsumerThreads / 32);  // each consumer warp
        mbarrier::init(bar<kFp8>(base, Bar::EmptyV, s), kConsumerThreads / 32);
      }
      mbarrier::fence_init();
    }
    key_range(a, w, reinterpret_cast<int*>(smem + L::kWarpMaxOffset));  // its block barrier publishes the inits
    const int n_tiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + kKeys - 1) / kKeys : 0;
    if constexpr (kRole == 0) consume<kFp8>(a, w, base, n_tiles, warp / 4, warp % 4, lane);
    if constexpr (kRole == 1) {
      if constexpr (kFp8) produce_fp8(a, w, base, smem, n_tiles, int(threadIdx.x) - kConsumerThreads);
      else produce_bf16(a, w, base, n_tiles, lane);
    }
    __syncthreads();  // every stage consumed and every barrier idle: the next row tile reuses them
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) attention_wgmma_kernel(const KernelArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (warp < kConsumerThreads / 32) {
    set_max_registers<kConsumerRegisters, true>();
    row_tiles<0, kFp8>(a, base, smem, warp, lane);
  } else {
    set_max_registers<kProducerRegisters, false>();
    if (kFp8 || warp == kConsumerThreads / 32) row_tiles<1, kFp8>(a, base, smem, warp, lane);
    else row_tiles<2, kFp8>(a, base, smem, warp, lane);
  }
}

template <bool kFp8>
void launch_kernel_of(const KernelLaunch& launch, const KernelArgs& a, dim3 grid) {
  launch_kernel(launch, attention_wgmma_kernel<kFp8>, grid, kThreads, Layout<kFp8>::kSmemBytes, a);
}

}  // namespace

void launch_prefill_wgmma(const KernelLaunch& launch, const KernelArgs& a, const PagedAttentionPlan& plan) {
  const int64_t blocks = int64_t(plan.n_row_tiles) * a.p.n_kv_heads * plan.n_splits;
  TETRA_CHECK(blocks <= INT_MAX, "paged_attention: ", blocks, " blocks is too many");
  const dim3 grid(unsigned(blocks), unsigned(a.p.n_seqs));
  if (a.p.fp8_cache) launch_kernel_of<true>(launch, a, grid);
  else launch_kernel_of<false>(launch, a, grid);
  TETRA_CUDA_CHECK_LAUNCH("paged_attention wgmma");
}

}  // namespace tetra::ops::cuda::gqa
