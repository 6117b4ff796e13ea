// The MoE layer of a decode step in one persistent kernel (sm_90a): grouping, gate/up with
// SiLU, down, and the weighted combine, with no other launch and no grid barrier.
//
// A decode step reads each touched expert's weights once for a few tokens, so the kernel is a
// weight stream. Every block first groups the step's (token, slot) rows by expert itself,
// in the same deterministic order as every other block (a stable counting sort in shared
// memory: no permute kernel), cutting each expert's rows into items of at most 8 tokens (one
// MMA column tile). The work is then units of 32 weight rows over the whole K:
//   - gate/up unit (item, 16 columns of h): 16 gate rows and the matching 16 up rows, K = H;
//   - down unit (item, 32 columns of out): 32 rows of W_down, K = I.
// Units come from a global counter, gate/up units first, so a block that takes a down unit of
// an item only ever waits for gate/up units that running blocks have already taken.
//
// Each block is 16 consumer warps, an epilogue warp and a producer warp, one block per SM. The ring of shared-
// memory slots is fed a piece at a time: a piece is rows that lie contiguous in memory over the
// whole K (a gate/up unit's 16 gate rows, then its 16 up rows; a down unit's 32 rows), so one
// bulk copy (TMA) brings a piece's codes and one its scales: copies of 6-50 KB, where the TMA
// unit runs at its best (per-row copies of 256 bytes, tried first, streamed at 0.8 TB/s: the
// unit's cost per copy, not the bytes, set the pace). The slot's unit travels with it.
// Consumer warp w takes the piece's 16-row tile (w % tiles) and a 1/(16 / tiles) share of its
// K chunks: the weights decode in registers exactly as in sm90_moe_gemm.cu (the same word order
// and the same mma.sync fragments), and the activations (x, or h written by other blocks) come
// from L1/L2. At a piece's end the consumers hand their partial sums to the epilogue warp
// (double-buffered), which adds them in a fixed order, so results are deterministic, and does the
// piece's global writes, fences and atomics while the consumers go on to the next piece (with
// the consumers doing it themselves, 37% of their time went to waiting at barriers for it).
//
// Cross-block hand-offs go through counters in CudaMoeExperts::decode_ctl, left zero by the
// block that uses them last: a gate/up unit counts itself done per item (down units of the item
// wait for all of them), and a down unit counts (token, column tile) slots; the block that
// completes a token's tile sums its slots' y in slot order into out, as launch_combine does.
#include <cuda_bf16.h>

#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/sm90_async.cuh"
#include "ops/cuda/sm90_nvfp4_decode.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kConsumerWarps = 16;
constexpr int kEpilogueWarp = kConsumerWarps;  // then the producer warp
constexpr int kProducerWarp = kConsumerWarps + 1;
constexpr int kThreads = (kConsumerWarps + 2) * 32;
constexpr int kMaxSlots = 8;
constexpr int kItemTokens = 8;
constexpr int kMaxStored = 1024;  // routed experts + the shared one
constexpr int64_t kRingBudget = 200 * 1024;  // shared memory for the ring, of the 227 KB a block may have
static_assert(kMoeDecodeMaxItems >= kMoeDecodeMaxRows + kMoeDecodeMaxRows / kItemTokens, "items of 8 rows");

struct DecodeItem {
  int expert, begin, n;  // rows [begin, begin + n) of the grouped order
};

struct DecodeParams {
  const uint16_t* x;     // bf16 [T, H]
  const int* ids;        // [T, k]
  const float* weights;  // [T, k]
  uint16_t* out;         // bf16 [T, H]
  const uint8_t *w13, *s13, *w2, *s2;
  const float* global_scale;  // [E', 3]
  int64_t w13_expert_bytes, s13_expert_bytes, w2_expert_bytes, s2_expert_bytes;
  uint16_t* h;  // bf16 [R, I]: silu(gate) * up, grouped rows
  float* y;     // f32 [R, H]: down projection, grouped rows
  MoeDecodeControl ctl;
  int n_tokens, top_k, n_experts, hidden, inter;
  int n_slots, slot_bytes;
  bool shared;
};

// The block's shared memory: this header, then the ring of n_slots slots of slot_bytes.
struct alignas(128) DecodeSmem {
  uint64_t full[kMaxSlots], empty[kMaxSlots];
  int2 meta[kMaxSlots];  // the slot's unit and piece; x < 0: no more work
  // The consumers' partial sums of a piece, double-buffered, for the epilogue warp.
  uint64_t red_full[2], red_empty[2];
  int2 red_meta[2];
  float red[2][kConsumerWarps][4][32];
  DecodeItem items[kMoeDecodeMaxItems];
  int row_token[kMoeDecodeMaxRows];  // token of each grouped row
  int pos[kMoeDecodeMaxRows];        // grouped row of each (token, slot)
  int n_items;
};

// Only while grouping, before the first copy: counting-sort arrays laid over the ring.
struct GroupScratch {
  int cnt[kMaxStored], off[kMaxStored], item_off[kMaxStored];
};

__device__ __forceinline__ uint8_t* ring_slot(DecodeSmem& sm, int slot, int slot_bytes) {
  return reinterpret_cast<uint8_t*>(&sm + 1) + int64_t(slot) * slot_bytes;
}

__device__ __forceinline__ int stored_expert(const DecodeParams& p, int r, int kk) {
  const int t = r / kk, j = r - t * kk;
  int e = j < p.top_k ? p.ids[int64_t(t) * p.top_k + j] : p.n_experts;
  if (unsigned(e) >= unsigned(p.n_experts + (p.shared ? 1 : 0))) e = 0;  // bad ids must not corrupt memory
  return e;
}

// Warp 0: rows (t, j) grouped by expert, in (t, j) order within an expert; the same result in
// every block.
__device__ void group_rows(const DecodeParams& p, DecodeSmem& sm, GroupScratch& g) {
  const int lane = threadIdx.x & 31;
  const int kk = p.top_k + (p.shared ? 1 : 0), n_rows = p.n_tokens * kk;
  const int n_stored = p.n_experts + (p.shared ? 1 : 0);
  for (int e = lane; e < n_stored; e += 32) g.cnt[e] = 0;
  __syncwarp();
  for (int base = 0; base < n_rows; base += 32) {
    const int r = base + lane;
    const int e = r < n_rows ? stored_expert(p, r, kk) : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int before = __popc(same & ((1u << lane) - 1u));
    const int c = e >= 0 ? g.cnt[e] : 0;
    __syncwarp();
    if (e >= 0) {
      sm.pos[r] = c + before;  // rank within the expert; the offset is added below
      if (before == __popc(same) - 1) g.cnt[e] = c + __popc(same);
    }
    __syncwarp();
  }
  // Exclusive scans of rows and items over the experts, each lane owning a run of them.
  const int per = (n_stored + 31) / 32;
  const int e0 = min(lane * per, n_stored), e1 = min(e0 + per, n_stored);
  int rows = 0, items = 0;
  for (int e = e0; e < e1; ++e) rows += g.cnt[e], items += (g.cnt[e] + kItemTokens - 1) / kItemTokens;
  int rows_incl = rows, items_incl = items;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ro = __shfl_up_sync(0xffffffffu, rows_incl, o);
    const int io = __shfl_up_sync(0xffffffffu, items_incl, o);
    if (lane >= o) rows_incl += ro, items_incl += io;
  }
  int r = rows_incl - rows, it = items_incl - items;
  for (int e = e0; e < e1; ++e) {
    g.off[e] = r;
    g.item_off[e] = it;
    r += g.cnt[e];
    it += (g.cnt[e] + kItemTokens - 1) / kItemTokens;
  }
  if (lane == 31) sm.n_items = items_incl;
  __syncwarp();
  for (int e = lane; e < n_stored; e += 32)
    for (int q = 0; q * kItemTokens < g.cnt[e]; ++q)
      sm.items[g.item_off[e] + q] = DecodeItem{e, g.off[e] + q * kItemTokens, min(kItemTokens, g.cnt[e] - q * kItemTokens)};
  for (int i = lane; i < n_rows; i += 32) {
    const int row = g.off[stored_expert(p, i, kk)] + sm.pos[i];
    sm.pos[i] = row;
    sm.row_token[row] = i / kk;
  }
}

// What a unit index means: units [0, n_gate_up) are gate/up, the rest down, item-major.
struct Unit {
  int item, tile;
  bool down;
};

__device__ __forceinline__ Unit unit_at(const DecodeParams& p, int u, int n_gate_up) {
  const int gu_tiles = p.inter / 16, dn_tiles = p.hidden / 32;
  if (u < n_gate_up) return Unit{u / gu_tiles, u % gu_tiles, false};
  u -= n_gate_up;
  return Unit{u / dn_tiles, u % dn_tiles, true};
}

// A piece: rows contiguous in memory over the whole K. Gate/up units have two of 16 rows
// (gate, up), down units one of 32.
struct Piece {
  int first_row, rows, k;
};

__device__ __forceinline__ Piece piece_of(const DecodeParams& p, const Unit& un, int piece) {
  if (un.down) return Piece{un.tile * 32, 32, p.inter};
  return Piece{(piece == 0 ? 0 : p.inter) + un.tile * 16, 16, p.hidden};
}

__device__ void produce(const DecodeParams& p, DecodeSmem& sm, int n_units, int n_gate_up) {
  const int lane = threadIdx.x & 31;
  for (int it = 0;;) {
    int u = 0;
    if (lane == 0) u = atomicAdd(p.ctl.next_unit, 1);
    u = __shfl_sync(0xffffffffu, u, 0);
    if (u >= n_units) {
      const int slot = it % p.n_slots;
      mbar_wait(&sm.empty[slot], ((it / p.n_slots) & 1) ^ 1);
      if (lane == 0) {
        sm.meta[slot] = make_int2(-1, 0);
        mbar_arrive(&sm.full[slot]);
      }
      return;
    }
    const Unit un = unit_at(p, u, n_gate_up);
    const int e = sm.items[un.item].expert;
    const uint8_t* w = un.down ? p.w2 + e * p.w2_expert_bytes : p.w13 + e * p.w13_expert_bytes;
    const uint8_t* s = un.down ? p.s2 + e * p.s2_expert_bytes : p.s13 + e * p.s13_expert_bytes;
    for (int piece = 0; piece < (un.down ? 1 : 2); ++piece, ++it) {
      const Piece pc = piece_of(p, un, piece);
      const int slot = it % p.n_slots;
      const uint32_t code_bytes = pc.rows * (pc.k / 2), scale_bytes = pc.rows * (pc.k / 16);
      mbar_wait(&sm.empty[slot], ((it / p.n_slots) & 1) ^ 1);
      uint8_t* dst = ring_slot(sm, slot, p.slot_bytes);
      if (lane == 0) {
        sm.meta[slot] = make_int2(u, piece);
        mbar_arrive_expect_tx(&sm.full[slot], code_bytes + scale_bytes);
        bulk_copy_g2s(dst, w + int64_t(pc.first_row) * (pc.k / 2), code_bytes, &sm.full[slot]);
        bulk_copy_g2s(dst + code_bytes, s + int64_t(pc.first_row) * (pc.k / 16), scale_bytes, &sm.full[slot]);
      }
      __syncwarp();
    }
  }
}

// A lane's activations for one 128-wide chunk: token slot g of the item, values [32t, 32t + 32).
// h is written during this kernel, so it is read through L2, never the read-only path.
__device__ __forceinline__ void load_b(uint4 (&b)[4], const uint16_t* b_row, bool coherent) {
  const uint4* q = reinterpret_cast<const uint4*>(b_row);
#pragma unroll
  for (int w = 0; w < 4; ++w) b[w] = coherent ? __ldcg(q + w) : __ldg(q + w);
}

__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One chunk of a consumer warp: rows g and g + 8 of its tile, 32 values each per lane.
__device__ __forceinline__ void compute_chunk(const uint4 (&a)[2], const uint32_t (&s)[2], const uint4 (&b)[4],
                                              float (&acc)[4]) {
  uint32_t sc[2][2];
#pragma unroll
  for (int r = 0; r < 2; ++r) scale_pair_to_bf16x2(s[r], sc[r][0], sc[r][1]);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t lo[4], hi[4];  // k-steps 2w and 2w + 1
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t q = word(a[r], w), sw = sc[r][w >> 1];
      lo[r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q), sw);
      lo[2 + r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q << 4), sw);
      hi[r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q << 8), sw);
      hi[2 + r] = bf16x2_mul(e2m1x2_to_bf16x2_raw(q << 12), sw);
    }
    mma_16x8x16(acc, lo, b[w].x, b[w].y);
    mma_16x8x16(acc, hi, b[w].z, b[w].w);
  }
}

// The epilogue warp after a down unit: counts the unit's tokens' column tile done and, where
// this was a token's last slot, sums the slots' y in slot order into out.
__device__ void combine_tile(const DecodeParams& p, const DecodeSmem& sm, const Unit& un, const DecodeItem& item) {
  const int lane = threadIdx.x & 31;
  const int kk = p.top_k + (p.shared ? 1 : 0), n_tiles = p.hidden / 32;
  int token = 0;
  bool last = false;
  if (lane < item.n) {
    token = sm.row_token[item.begin + lane];
    last = atomic_add_acq_rel_gpu(p.ctl.tile_count + token * n_tiles + un.tile, 1) == kk - 1;
  }
  unsigned todo = __ballot_sync(0xffffffffu, last);
  const int col = un.tile * 32 + lane;
  while (todo) {
    const int s = __ffs(todo) - 1;
    todo &= todo - 1;
    const int t = __shfl_sync(0xffffffffu, token, s);
    float acc = 0.0f;
#pragma unroll 3
    for (int j = 0; j < kk; ++j) {
      const float wj = j < p.top_k ? p.weights[int64_t(t) * p.top_k + j] : 1.0f;
      acc += wj * __ldcg(p.y + int64_t(sm.pos[t * kk + j]) * p.hidden + col);
    }
    __nv_bfloat16 o = __float2bfloat16_rn(acc);
    p.out[int64_t(t) * p.hidden + col] = *reinterpret_cast<uint16_t*>(&o);
    if (lane == s) p.ctl.tile_count[t * n_tiles + un.tile] = 0;  // every slot has counted: reset for the next launch
  }
  if (lane == 0 && atomicAdd(p.ctl.item_down + un.item, 1) == n_tiles - 1) {
    // Every down unit of the item has passed its wait: its counters are free for the next launch.
    p.ctl.item_gate_up[un.item] = 0;
    p.ctl.item_down[un.item] = 0;
  }
}

// The epilogue warp: for every piece, in order, the consumers' partial sums added in K order;
// after a gate piece it keeps the gate sums, after an up piece it writes h and counts the unit
// done, after a down piece it writes y and combines. Its global round trips (fences, atomics)
// overlap the consumers' next pieces.
__device__ void epilogue(const DecodeParams& p, DecodeSmem& sm, int n_gate_up) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float gate[4] = {0.f, 0.f, 0.f, 0.f};
  for (int n = 0;; ++n) {
    const int rb = n & 1;
    mbar_wait(&sm.red_full[rb], (n >> 1) & 1);
    const int2 meta = sm.red_meta[rb];
    if (meta.x < 0) return;
    const Unit un = unit_at(p, meta.x, n_gate_up);
    const DecodeItem item = sm.items[un.item];
    const int tiles = un.down ? 2 : 1;
    float sum[2][4];
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v = 0.0f;
        if (tile < tiles)
          for (int w = tile; w < kConsumerWarps; w += tiles) v += sm.red[rb][w][i][lane];
        sum[tile][i] = v;
      }
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.red_empty[rb]);
    const float* gs = p.global_scale + item.expert * 3;
    if (!un.down && meta.y == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) gate[i] = sum[0][i];
    } else if (!un.down) {
      const float gs_gate = gs[0] * 256.0f, gs_up = gs[1] * 256.0f;  // the 2^-8 left in the decoded weights
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int slot = 2 * t + (i & 1);
        if (slot >= item.n) continue;
        const float gv = gate[i] * gs_gate, up = sum[0][i] * gs_up;
        const float hv = gv / (1.0f + __expf(-gv)) * up;
        const int col = un.tile * 16 + g + (i >= 2 ? 8 : 0);
        __nv_bfloat16 hb = __float2bfloat16_rn(hv);
        __stcg(p.h + int64_t(item.begin + slot) * p.inter + col, *reinterpret_cast<uint16_t*>(&hb));
      }
      __syncwarp();
      if (lane == 0) red_add_release_gpu(p.ctl.item_gate_up + un.item, 1);  // h of this tile is visible first
    } else {
      const float gs_down = gs[2] * 256.0f;
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int slot = 2 * t + (i & 1);
          if (slot >= item.n) continue;
          const int col = un.tile * 32 + 16 * tile + g + (i >= 2 ? 8 : 0);
          __stcg(p.y + int64_t(item.begin + slot) * p.hidden + col, sum[tile][i] * gs_down);
        }
      __syncwarp();  // the y stores come before the counts (the counting atomics release them)
      combine_tile(p, sm, un, item);
    }
  }
}

// Hands a piece's partial sums (or, with meta.x < 0, the end) to the epilogue warp through
// red buffer n & 1.
__device__ __forceinline__ void hand_to_epilogue(DecodeSmem& sm, int n, int2 meta, const float (&acc)[4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rb = n & 1;
  mbar_wait(&sm.red_empty[rb], ((n >> 1) & 1) ^ 1);
#pragma unroll
  for (int i = 0; i < 4; ++i) sm.red[rb][warp][i][lane] = acc[i];
  if (warp == 0 && lane == 0) sm.red_meta[rb] = meta;
  __syncwarp();
  if (lane == 0) mbar_arrive(&sm.red_full[rb]);
}

__device__ void consume(const DecodeParams& p, DecodeSmem& sm, int n_gate_up) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int it = 0;; ++it) {
    const int slot = it % p.n_slots;
    mbar_wait(&sm.full[slot], (it / p.n_slots) & 1);
    const int2 meta = sm.meta[slot];
    if (meta.x < 0) {
      hand_to_epilogue(sm, it, meta, {0.f, 0.f, 0.f, 0.f});
      return;
    }
    const Unit un = unit_at(p, meta.x, n_gate_up);
    const DecodeItem item = sm.items[un.item];
    const Piece pc = piece_of(p, un, meta.y);
    // This warp's tile of the piece and its share of the K chunks.
    const int tiles = pc.rows / 16, parts = kConsumerWarps / tiles;
    const int tile = warp % tiles, part = warp / tiles;
    const int n_chunks = pc.k / kMoeChunkK;
    const int c_begin = part * n_chunks / parts, c_end = (part + 1) * n_chunks / parts;
    if (un.down) {
      // h of the item is complete once all its gate/up units have counted (each released it).
      const int need = p.inter / 16;
      if (lane == 0)
        while (ld_acquire_gpu(p.ctl.item_gate_up + un.item) < need) __nanosleep(64);
      __syncwarp();
    }
    // This lane's activation row (token slot g), or none.
    const uint16_t* b_row = nullptr;
    if (g < item.n)
      b_row = un.down ? p.h + int64_t(item.begin + g) * p.inter
                      : p.x + int64_t(sm.row_token[item.begin + g]) * p.hidden;
    const uint8_t* codes = ring_slot(sm, slot, p.slot_bytes) + (16 * tile + g) * (pc.k / 2) + 16 * t;
    const uint8_t* scales = ring_slot(sm, slot, p.slot_bytes) + pc.rows * (pc.k / 2) + (16 * tile + g) * (pc.k / 16) + 2 * t;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint4 b[4], b_next[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) b[w] = make_uint4(0, 0, 0, 0);
    if (b_row && c_begin < c_end) load_b(b, b_row + c_begin * kMoeChunkK + 32 * t, un.down);
    for (int c = c_begin; c < c_end; ++c) {
      uint4 a[2];
      uint32_t s[2];
      a[0] = *reinterpret_cast<const uint4*>(codes + c * 64);
      a[1] = *reinterpret_cast<const uint4*>(codes + c * 64 + 8 * (pc.k / 2));
      s[0] = *reinterpret_cast<const uint16_t*>(scales + c * 8);
      s[1] = *reinterpret_cast<const uint16_t*>(scales + c * 8 + 8 * (pc.k / 16));
#pragma unroll
      for (int w = 0; w < 4; ++w) b_next[w] = make_uint4(0, 0, 0, 0);
      if (b_row && c + 1 < c_end) load_b(b_next, b_row + (c + 1) * kMoeChunkK + 32 * t, un.down);
      compute_chunk(a, s, b, acc);
#pragma unroll
      for (int w = 0; w < 4; ++w) b[w] = b_next[w];
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.empty[slot]);  // the piece's bytes are no longer needed
    hand_to_epilogue(sm, it, meta, acc);
  }
}

__global__ void __launch_bounds__(kThreads, 1) moe_decode_kernel(DecodeParams p) {
  extern __shared__ __align__(128) uint8_t decode_smem[];
  DecodeSmem& sm = *reinterpret_cast<DecodeSmem*>(decode_smem);
  const int warp = threadIdx.x >> 5;
  // With PDL the router may still run: wait for its ids. Blocks of the next kernel may start
  // early once every block here is resident; this kernel's blocks never wait for a block that
  // is not running (units are taken in order), so they cannot be starved by them.
  pdl_wait();
  pdl_launch_dependents();
  if (warp == 0) {
    group_rows(p, sm, *reinterpret_cast<GroupScratch*>(ring_slot(sm, 0, p.slot_bytes)));
    fence_proxy_async_smem();  // the ring's bytes were the grouping's; bulk copies write them next
    if (threadIdx.x == 0) {
      for (int s = 0; s < p.n_slots; ++s) {
        mbar_init(&sm.full[s], 1);
        mbar_init(&sm.empty[s], kConsumerWarps);
      }
      for (int b = 0; b < 2; ++b) {
        mbar_init(&sm.red_full[b], kConsumerWarps);
        mbar_init(&sm.red_empty[b], 1);
      }
      mbar_init_fence();
    }
  }
  __syncthreads();
  const int n_items = sm.n_items;
  const int n_gate_up = n_items * (p.inter / 16);
  const int n_units = n_gate_up + n_items * (p.hidden / 32);
  if (warp == kProducerWarp)
    produce(p, sm, n_units, n_gate_up);
  else if (warp == kEpilogueWarp)
    epilogue(p, sm, n_gate_up);
  else
    consume(p, sm, n_gate_up);
  __syncthreads();
  if (threadIdx.x == 0) {
    // The last block out leaves the unit counter at zero for the next launch.
    __threadfence();
    if (atomicAdd(p.ctl.exited, 1) == int(gridDim.x) - 1) {
      *p.ctl.next_unit = 0;
      *p.ctl.exited = 0;
    }
  }
}

// The largest piece: 16 rows over H (gate or up) or 32 over I (down), codes and scales.
int64_t slot_bytes_for(const MoeShape& s) {
  return std::max<int64_t>(16 * (s.hidden / 2 + s.hidden / 16), 32 * (s.intermediate / 2 + s.intermediate / 16));
}

int slots_for(const MoeShape& s) { return int(std::min<int64_t>(kMaxSlots, kRingBudget / slot_bytes_for(s))); }

}  // namespace

bool moe_decode_takes(const CudaMoeExperts& ex, int64_t n_tokens, int top_k) {
  const int64_t rows = n_tokens * (top_k + (ex.shape.shared_expert ? 1 : 0));
  // At least two pieces in flight; the grouping's scratch fits in the ring.
  const int64_t ring = slots_for(ex.shape) * slot_bytes_for(ex.shape);
  return ex.format == WeightFormat::Nvfp4 && ex.fast && ex.decode_ctl.next_unit != nullptr &&
         slots_for(ex.shape) >= 2 && ring >= int64_t(sizeof(GroupScratch)) && n_tokens >= 1 &&
         n_tokens <= kMoeDecodeMaxTokens && rows <= kMoeDecodeMaxRows && ex.n_stored() <= kMaxStored;
}

void launch_moe_decode(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* x, const int* ids,
                       const float* weights, int n_tokens, int top_k, const MoeScratch& s, uint16_t* out) {
  TETRA_CHECK(moe_decode_takes(ex, n_tokens, top_k), "moe: the fused decode kernel does not take this call (",
              n_tokens, " tokens, top-k ", top_k, "): moe_experts checks moe_decode_takes first");
  DecodeParams p{};
  p.x = x;
  p.ids = ids;
  p.weights = weights;
  p.out = out;
  p.w13 = static_cast<const uint8_t*>(ex.w13);
  p.s13 = ex.w13_scale;
  p.w2 = static_cast<const uint8_t*>(ex.w2);
  p.s2 = ex.w2_scale;
  p.global_scale = ex.global_scale;
  p.w13_expert_bytes = ex.w13_expert_bytes();
  p.s13_expert_bytes = ex.w13_scale_expert_bytes();
  p.w2_expert_bytes = ex.w2_expert_bytes();
  p.s2_expert_bytes = ex.w2_scale_expert_bytes();
  p.h = s.h;
  p.y = s.y;
  p.ctl = ex.decode_ctl;
  p.n_tokens = n_tokens;
  p.top_k = top_k;
  p.n_experts = ex.shape.n_experts;
  p.hidden = int(ex.shape.hidden);
  p.inter = int(ex.shape.intermediate);
  p.shared = ex.shape.shared_expert;
  p.slot_bytes = int(slot_bytes_for(ex.shape));
  p.n_slots = slots_for(ex.shape);

  const int smem = int(sizeof(DecodeSmem)) + p.n_slots * p.slot_bytes;
  TETRA_CUDA_CHECK(cudaFuncSetAttribute(moe_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int device = 0, sms = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&device));
  TETRA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  launch_kernel(launch, moe_decode_kernel, sms, kThreads, smem, p);
}

}  // namespace tetra::ops::cuda
