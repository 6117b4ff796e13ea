// The grouped expert GEMMs of the MoE layer for many tokens per expert (sm_90a, wgmma).
//
// Prefill gives every expert tens to hundreds of tokens, so the weights are reused and the
// tensor cores set the pace. A block is three warpgroups, split by role (as FlashAttention-3
// and CUTLASS's warp-specialized mainloops are):
// - two consumer warpgroups each own 64 weight rows (wgmma's M) of the block's work item,
//   whose tokens are wgmma's N (64, 128, 192 or 256). NVFP4 weights are decoded from shared
//   memory straight into wgmma's A fragments (A may come from registers on Hopper, B may
//   not), a chunk ahead, while the tensor cores run the chunk before (wgmma wait_group 1);
// - the producer warpgroup copies each K-chunk (128 values) of the activations, 128-byte
//   swizzled as wgmma's K-major B wants them, and of the consumers' weight blocks into a ring
//   of kStages stages with cp.async, and hands a stage over through an mbarrier once its bytes
//   have landed; the consumers give it back through another once its MMAs are done. No
//   block-wide barrier in the main loop, and the consumers issue no copies.
// setmaxnreg moves registers from the producer (40) to the consumers (232).
//
// Fragment order: wgmma reads B in natural K order, so A must be natural too. Lane (g, t)
// of k-step j (16 values of K) needs values 2t, 2t+1 (a0, a1) and 2t+8, 2t+9 (a2, a3), which
// are pair t of words 2j and 2j+1 of its row: every lane reads all 64 bytes of a row's chunk
// (the 4 lanes of a row load the same addresses, one request) and decodes its own pair with
// the two rotations nvfp4_pair_decode(t) gives it (nvfp4_word.h).
// k-step j is exactly block-scale group j of the chunk, so each row needs all 8 of its scales.
// The weights are in the blocks of nvfp4_tile.h: a consumer warp's 16 rows are one block, a
// chunk of it 1,024 contiguous bytes of codes (row r's 64 at 64 r) and 128 of scales (rows r
// and r + 8's 16 at 16 r); the stage keeps them so, with row r's 16-byte units rotated by
// (r / 2) % 4, so that the 8 rows a warp's load reads at once fall in distinct banks.
#include <cuda_bf16.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mbarrier.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/nvfp4_tile.h"
#include "ops/cuda/sm90_nvfp4_decode.cuh"
#include "ops/cuda/wgmma.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kWgs = 2;                       // consumer warpgroups per block
constexpr int kConsumerThreads = kWgs * 128;  // threads 0..255; the producer warpgroup follows
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
// The block's pool is what the launch bounds give every thread (64K registers over kThreads, in
// 8s); setmaxnreg.inc past it would wait forever.
static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                  (64 * 1024 / kThreads) / 8 * 8 * kThreads,
              "setmaxnreg moves registers within the block's pool");
constexpr int kRowBytes = kMoeChunkK * 2;  // one token's BF16 activations of one chunk
static_assert(kMoeChunkK == 128 && kMoeChunkK == kNvfp4TileK, "a chunk is two 64-value swizzle rows, one tile block");
// A consumer warp's weights of one chunk in a stage: its block's codes, then its scales.
constexpr int kWarpABytes = kNvfp4TileCodeBytes + kNvfp4TileScaleBytes;  // 1,152
constexpr int kABytes = (kConsumerThreads / 32) * kWarpABytes;          // 9,216

template <int kN>
struct TileShape {
  static constexpr int kStages = kN == 256 || kN == 192 ? 3 : kN == 128 ? 5 : 8;  // K-chunks in flight
  static constexpr int kBBytes = kN * kRowBytes;
  static constexpr int kStageBytes = kBBytes + kABytes;  // B first: its atoms stay 1,024-aligned
  static constexpr int kBarOffset = kStages * kStageBytes;
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + the barriers, alignment slack
  static constexpr int kAcc = kN / 2;  // f32 accumulators per thread (64 rows x kN / 128)
  // The producer hands chunk c over once chunk c + kLag is issued, so kLag + 1 chunks are in
  // flight. Issuing chunk c + kLag waits for the consumers to give back chunk c + kLag - kStages,
  // which they do before they wait for chunk c - (kStages - 2 - kLag): kLag <= kStages - 2 keeps
  // the two from waiting on each other, and each chunk of margin below it keeps the producer's
  // wake-up, copies and hand-over off the consumers' path.
  static constexpr int kLag = kStages / 2;
  static_assert(kLag >= 1 && kLag <= kStages - 2, "chunks in flight, and no deadlock");
  static_assert(kStageBytes % 1024 == 0 && kSmemBytes <= 227 * 1024, "stages fit, B atoms aligned");
};

// ---- PTX wrappers ----

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 writes zeros: the empty token slots of a partial tile.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ uint4 lds_16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// A warpgroup's register count from here on (all its warps execute it).
template <int kCount, bool kIncrease>
__device__ __forceinline__ void set_max_registers() {
  if constexpr (kIncrease) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kCount));
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kCount));
}

// Where 16-byte unit u (0..3) of row r (0..15) of a warp's codes sits in its stage block.
__device__ __forceinline__ uint32_t a_code_unit(int r, int u) { return uint32_t(64 * r + 16 * (u ^ ((r >> 1) & 3))); }

// ---- the producer warpgroup ----

struct Ring {
  uint32_t base;  // 1,024-aligned
  template <int kN>
  __device__ uint32_t b(int stage) const { return base + uint32_t(stage * TileShape<kN>::kStageBytes); }
  template <int kN>
  __device__ uint32_t a(int stage) const { return b<kN>(stage) + TileShape<kN>::kBBytes; }
  template <int kN>
  __device__ uint32_t full(int stage) const { return base + TileShape<kN>::kBarOffset + 8 * stage; }
  template <int kN>
  __device__ uint32_t empty(int stage) const { return full<kN>(TileShape<kN>::kStages + stage); }
};

// The consumer warps' weight blocks: warp w's is tile (blockIdx.x * 8 + w) of rows, gate/up
// interleaved by 8 (its lanes' rows g and g + 8 are one column's gate and up) or down's 16
// consecutive rows; the tiles of a row block follow each other, chunk after chunk.
struct ABlocks {
  const uint8_t* codes;   // warp 0's, chunk 0
  const uint8_t* scales;
  int64_t code_stride, scale_stride;  // from one warp's block to the next
};

// One chunk of a stage, by producer thread t: the activations of the item's kN token slots
// (row r of the tile is token slot r, its 128 values two 128-byte swizzle rows (K-atoms) kN *
// 128 bytes apart, 16-byte unit c of a swizzle row at unit c ^ (r % 8)), then each consumer
// warp's weight block.
template <int kN>
__device__ __forceinline__ void load_stage(uint32_t b_stage, uint32_t a_stage, const uint16_t* const* rows,
                                           const uint16_t* any, const ABlocks& a, int chunk, int t) {
  constexpr int kBUnits = kN * kRowBytes / 16;
  static_assert(kBUnits % 128 == 0, "every producer thread copies the same number of B units");
#pragma unroll 4
  for (int i = 0; i < kBUnits / 128; ++i) {
    const int q = t + i * 128;
    const int r = q >> 4, u = q & 15, atom = u >> 3, c = u & 7;
    const uint16_t* src = rows[r];
    const uint32_t dst = b_stage + atom * (kN * 128) + r * 128 + ((c ^ (r & 7)) << 4);
    cp_async_16(dst, src ? src + chunk * kMoeChunkK + u * 8 : any, src != nullptr);
  }
  constexpr int kWarpUnits = kWarpABytes / 16;  // 64 of codes, 8 of scales
  for (int q = t; q < (kConsumerThreads / 32) * kWarpUnits; q += 128) {
    const int w = q / kWarpUnits, j = q % kWarpUnits;
    const uint32_t dst = a_stage + uint32_t(w * kWarpABytes);
    if (j < 64) {
      cp_async_16(dst + a_code_unit(j / 4, j % 4), a.codes + w * a.code_stride + chunk * kNvfp4TileCodeBytes + 16 * j,
                  true);
    } else {
      cp_async_16(dst + kNvfp4TileCodeBytes + 16 * (j - 64),
                  a.scales + w * a.scale_stride + chunk * kNvfp4TileScaleBytes + 16 * (j - 64), true);
    }
  }
}

// Chunk `chunk`'s copies (this thread's, and through __syncwarp the warp's) have landed: made
// visible to the tensor cores' reads and handed to the consumers, one arrival a warp.
template <int kN>
__device__ __forceinline__ void hand_over(const Ring& ring, int chunk, int lane) {
  wgmma::fence_proxy_async();
  __syncwarp();
  if (lane == 0) mbarrier::arrive(ring.full<kN>(chunk % TileShape<kN>::kStages));
}

template <int kN>
__device__ __forceinline__ void produce(const MoeGemmParams& p, const MoeWorkItem& item, const Ring& ring,
                                        const uint16_t* const* brows, int n_chunks, int t) {
  using S = TileShape<kN>;
  const int lane = t & 31;
  const int64_t block = nvfp4_tile_block(int64_t(blockIdx.x) * (kConsumerThreads / 32) * kNvfp4TileRows, 0, p.k);
  const int64_t blocks_per_tile = nvfp4_tile_block(kNvfp4TileRows, 0, p.k);  // a row tile's chunks
  const ABlocks a{p.w + item.expert * p.w_expert_bytes + block * kNvfp4TileCodeBytes,
                  p.w_scale + item.expert * p.s_expert_bytes + block * kNvfp4TileScaleBytes,
                  blocks_per_tile * kNvfp4TileCodeBytes, blocks_per_tile * kNvfp4TileScaleBytes};
  for (int c = 0; c < n_chunks; ++c) {
    const int stage = c % S::kStages;
    if (c >= S::kStages) mbarrier::wait(ring.empty<kN>(stage), uint32_t((c / S::kStages - 1) & 1));
    load_stage<kN>(ring.b<kN>(stage), ring.a<kN>(stage), brows, p.b, a, c, t);
    cp_async_commit();
    if (c >= S::kLag) {
      cp_async_wait<S::kLag>();
      hand_over<kN>(ring, c - S::kLag, lane);
    }
  }
  cp_async_wait<0>();
  for (int c = max(0, n_chunks - S::kLag); c < n_chunks; ++c) hand_over<kN>(ring, c, lane);
}

// ---- the consumer warpgroups ----

// The chunk's 8 k-steps of A fragments for lane (g, t) of consumer warp w (pair =
// nvfp4_pair_decode(t)), from the stage: rows g and g + 8, one 16-byte unit of each at a time.
__device__ __forceinline__ void decode_a(uint32_t a_stage, int w, int g, const Nvfp4PairDecode& pair,
                                         uint32_t (&frag)[8][4]) {
  const uint32_t block = a_stage + uint32_t(w * kWarpABytes);
  const uint4 s = lds_16(block + kNvfp4TileCodeBytes + 16 * g);
  uint32_t sc[2][8];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int p = 0; p < 4; ++p) scale_pair_to_bf16x2(word(s, p) >> (16 * r), sc[r][2 * p], sc[r][2 * p + 1]);
#pragma unroll
  for (int v = 0; v < 4; ++v) {  // unit v of a row holds k-steps 2v and 2v + 1
    const uint4 row[2] = {lds_16(block + a_code_unit(g, v)), lds_16(block + a_code_unit(g + 8, v))};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * v + h;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t lo = word(row[r], 2 * h), hi = word(row[r], 2 * h + 1);
        frag[j][r] = bf16x2_mul(nvfp4_pair_raw(lo, pair), sc[r][j]);      // k 2t, 2t+1
        frag[j][2 + r] = bf16x2_mul(nvfp4_pair_raw(hi, pair), sc[r][j]);  // k 2t+8, 2t+9
      }
    }
  }
}

// Issues one chunk of MMAs: 8 k-steps of 16, k-step j reads K-atom j / 4 at byte offset
// 32 (j % 4). Every input register is defined before the fence.
template <int kN>
__device__ __forceinline__ void mma_issue(float (&acc)[TileShape<kN>::kAcc], const uint32_t (&frag)[8][4],
                                          uint32_t stage) {
  uint64_t desc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) desc[j] = wgmma::desc_k_major(stage + (j >> 2) * (kN * 128) + (j & 3) * 32);
  wgmma::fence();
#pragma unroll
  for (int j = 0; j < 8; ++j) wgmma::mma_rs(acc, frag[j], desc[j]);
  wgmma::commit();
}

// The stage of chunk `chunk` is done with (its MMAs have completed): one arrival a warp.
template <int kN>
__device__ __forceinline__ void give_back(const Ring& ring, int chunk, int lane) {
  __syncwarp();
  if (lane == 0) mbarrier::arrive(ring.empty<kN>(chunk % TileShape<kN>::kStages));
}

// acc[64 rows x kN tokens] of this warpgroup over the whole K. Chunk c + 1's fragments are
// decoded while chunk c's MMAs run, into the set chunk c - 1's MMAs (now retired) read: two
// sets, alternating, so ptxas sees no register written under an outstanding group that reads
// it (else it serializes the wgmmas, warning C7513).
template <int kN>
__device__ __forceinline__ void consume(const Ring& ring, int n_chunks, int w, int lane,
                                        float (&acc)[TileShape<kN>::kAcc]) {
  using S = TileShape<kN>;
#pragma unroll
  for (int i = 0; i < S::kAcc; ++i) acc[i] = 0.0f;
  const int g = lane >> 2;
  const Nvfp4PairDecode pair = nvfp4_pair_decode(lane & 3);
  uint32_t frag[2][8][4];
  mbarrier::wait(ring.full<kN>(0), 0);
  decode_a(ring.a<kN>(0), w, g, pair, frag[0]);
  for (int c = 0; c < n_chunks; c += 2) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // unrolled so that frag[half] is a fixed register set
      const int cc = c + half;
      if (cc >= n_chunks) break;
      mma_issue<kN>(acc, frag[half], ring.b<kN>(cc % S::kStages));
      wgmma::wait<1>();  // chunk cc - 1's MMAs
      if (cc > 0) give_back<kN>(ring, cc - 1, lane);
      const int next = cc + 1;
      if (next < n_chunks) {
        mbarrier::wait(ring.full<kN>(next % S::kStages), uint32_t((next / S::kStages) & 1));
        decode_a(ring.a<kN>(next % S::kStages), w, g, pair, frag[half ^ 1]);
      }
    }
  }
  wgmma::wait<0>();
  wgmma::fence_acc(acc);
  give_back<kN>(ring, n_chunks - 1, lane);
}

// The shared prologue: the item, the token row table, the ring and its barriers.
template <int kN>
__device__ __forceinline__ bool setup_block(const MoeGemmParams& p, MoeWorkItem& item, const uint16_t** brows,
                                            Ring& ring) {
  if (int(blockIdx.y) >= *p.n_items) return false;  // the whole block leaves together
  item = p.items[blockIdx.y];
  for (int r = threadIdx.x; r < kN; r += kThreads) {
    const uint16_t* src = nullptr;
    if (r < item.n_rows) {
      const int prow = item.row_begin + r;
      const int brow = p.b_rows ? p.b_rows[prow] : prow;
      src = p.b + int64_t(brow) * p.k;
    }
    brows[r] = src;
  }
  extern __shared__ uint8_t dsmem[];
  ring.base = (static_cast<uint32_t>(__cvta_generic_to_shared(dsmem)) + 1023u) & ~1023u;
  if (threadIdx.x == 0) {
    for (int s = 0; s < TileShape<kN>::kStages; ++s) {
      mbarrier::init(ring.full<kN>(s), 4);                         // each producer warp
      mbarrier::init(ring.empty<kN>(s), kConsumerThreads / 32);   // each consumer warp
    }
    mbarrier::fence_init();
  }
  __syncthreads();  // the row table and the barriers
  return true;
}

// One work item's GEMM for 64 rows per consumer warpgroup. Gate/up (kGateUp): h = silu(x
// W_gate^T) * (x W_up^T); warp w of warpgroup wg owns h columns n0 + 8w .. n0 + 8w + 7, one
// tile of the interleaved gate/up matrix: its fragment row g is the gate row of column n0 + 8w
// + g and row g + 8 the up row of the same column, so SiLU x up meets in one thread. Down: y =
// h W_down^T; warp w owns output columns n0 + 16w .. n0 + 16w + 15. Either way a warp's rows
// are one block of nvfp4_tile.h, tile blockIdx.x * 8 + (its consumer warp).
template <int kN, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) wgmma_kernel(MoeGemmParams p) {
  __shared__ const uint16_t* brows[kN];
  MoeWorkItem item;
  Ring ring;
  pdl_wait();
  pdl_launch_dependents();
  if (!setup_block<kN>(p, item, brows, ring)) return;
  const int n_chunks = p.k / kMoeChunkK;
  if (threadIdx.x >= kConsumerThreads) {
    set_max_registers<kProducerRegisters, false>();
    produce<kN>(p, item, ring, brows, n_chunks, int(threadIdx.x) - kConsumerThreads);
    return;
  }
  set_max_registers<kConsumerRegisters, true>();
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int col = kGateUp ? (blockIdx.x * kWgs + wg) * 32 + 8 * warp + g
                          : (blockIdx.x * kWgs + wg) * 64 + 16 * warp + g;
  float acc[TileShape<kN>::kAcc];
  consume<kN>(ring, n_chunks, 4 * wg + warp, lane, acc);

  // 256: the 2^-8 the decode leaves in the weights.
  const float* gs = p.global_scale + item.expert * 3;
  const float gs_a = gs[kGateUp ? 0 : 2] * 256.0f, gs_b = gs[kGateUp ? 1 : 2] * 256.0f;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int slot = 8 * i + 2 * t + e;
      if (slot >= item.n_rows) continue;
      const float a = acc[4 * i + e] * gs_a, b = acc[4 * i + 2 + e] * gs_b;  // rows g, g + 8
      const int64_t row = item.row_begin + slot;
      if constexpr (kGateUp) {
        const __nv_bfloat16 hb = __float2bfloat16_rn(a / (1.0f + __expf(-a)) * b);
        p.h[row * p.n + col] = *reinterpret_cast<const uint16_t*>(&hb);
      } else {
        p.y[row * p.n + col] = a;
        p.y[row * p.n + col + 8] = b;
      }
    }
}


// The column tile is the grid's fastest index: the blocks resident at once share a few items,
// whose activations are read from memory once and then from L2 by every column tile. (With the
// item fastest, the resident blocks spanned about 132 items of one column tile, and every
// column pass streamed every item's activations again: at 8,192 tokens, 12 passes over 268 MB
// of x for gate/up and 16 over 101 MB of h for down.)
template <int kN>
void launch_tile(const KernelLaunch& launch, const MoeGemmParams& p, int max_items, bool gate_up) {
  constexpr int kSmem = TileShape<kN>::kSmemBytes;
  TETRA_CHECK(max_items <= 65535, "moe: ", max_items, " work items exceed the grid's y");
  if (gate_up)
    launch_kernel(launch, wgmma_kernel<kN, true>, dim3(p.n / (kWgs * 32), max_items), kThreads, kSmem, p);
  else
    launch_kernel(launch, wgmma_kernel<kN, false>, dim3(p.n / (kWgs * 64), max_items), kThreads, kSmem, p);
}

void launch_wgmma(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* b, const int* b_rows,
                  const MoeScratch& s, int tile_tokens, bool gate_up) {
  TETRA_CHECK(ex.format == WeightFormat::Nvfp4, "moe: the wgmma path (tile_tokens ", tile_tokens,
              ") is for NVFP4 weights");
  MoeGemmParams p = moe_gemm_params(ex, s, gate_up);
  // The consumers wait for chunk 0: a K of no whole chunk would leave them waiting.
  TETRA_CHECK(p.k >= kMoeChunkK && p.k % kMoeChunkK == 0, "moe: the wgmma path takes K in whole chunks of ",
              kMoeChunkK, ", not ", p.k);
  p.b = b;
  p.b_rows = b_rows;
  if (tile_tokens == 64)
    launch_tile<64>(launch, p, s.max_items, gate_up);
  else if (tile_tokens == 128)
    launch_tile<128>(launch, p, s.max_items, gate_up);
  else if (tile_tokens == 192)
    launch_tile<192>(launch, p, s.max_items, gate_up);
  else if (tile_tokens == 256)
    launch_tile<256>(launch, p, s.max_items, gate_up);
  else
    fail("moe: the wgmma path takes tile_tokens 64, 128, 192 or 256, not ", tile_tokens);
}

}  // namespace

void launch_gate_up_wgmma(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* x,
                          const MoeScratch& s, int tile_tokens) {
  launch_wgmma(launch, ex, x, s.row_token, s, tile_tokens, true);
}

void launch_down_wgmma(const KernelLaunch& launch, const CudaMoeExperts& ex, const MoeScratch& s,
                       int tile_tokens) {
  launch_wgmma(launch, ex, s.h, nullptr, s, tile_tokens, false);
}

}  // namespace tetra::ops::cuda
