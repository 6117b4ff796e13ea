// The grouped expert GEMMs of the MoE layer for many tokens per expert (sm_90a, wgmma).
//
// Prefill gives every expert tens to hundreds of tokens, so the weights are reused and the
// tensor cores set the pace. A block is two warpgroups; each owns 64 weight rows (wgmma's M)
// and the block's work item gives the tokens (wgmma's N: 64, 128, 192 or 256). NVFP4 weights are
// decoded in registers straight into wgmma's A fragments (A may come from registers on
// Hopper, B may not); the activations go to shared memory with cp.async, 128-byte swizzled
// as wgmma's K-major B wants them, through a ring of kStages K-chunks.
//
// Fragment order: wgmma reads B in natural K order, so A must be natural too. Lane (g, t)
// of k-step j (16 values of K) needs values 2t, 2t+1 (a0, a1) and 2t+8, 2t+9 (a2, a3), which
// are pair t of words 2j and 2j+1 of its row: every lane reads all 64 bytes of a row's chunk
// (the 4 lanes of a row load the same addresses, one request) and decodes its own pair with
// the two rotations nvfp4_pair_decode(t) gives it (nvfp4_word.h).
// k-step j is exactly block-scale group j of the chunk, so each row needs all 8 of its scales.
// The weights are in the blocks of nvfp4_tile.h: a row's chunk is 64 contiguous bytes, and the
// next chunk's 1,024 further; its 8 scales sit in one 16-byte piece, in 2-byte pairs that
// alternate with those of the row 8 apart.
#include <cuda_bf16.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/nvfp4_tile.h"
#include "ops/cuda/sm90_nvfp4_decode.cuh"
#include "ops/cuda/wgmma.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kWgs = 2;                 // warpgroups per block
constexpr int kThreads = kWgs * 128;
constexpr int kRowBytes = kMoeChunkK * 2;  // one token's BF16 activations of one chunk
static_assert(kMoeChunkK == 128, "a chunk is two 64-value swizzle rows");

template <int kN>
struct TileShape {
  static constexpr int kStages = kN == 256 ? 3 : kN == 192 ? 4 : kN == 128 ? 5 : 8;  // K-chunks in flight
  static constexpr int kStageBytes = kN * kRowBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack
  static constexpr int kAcc = kN / 2;  // f32 accumulators per thread (64 rows x kN / 128)
};

// ---- PTX wrappers ----

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 writes zeros: the empty token slots of a partial tile.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// ---- operands ----

// A lane's weights of one chunk: the 64 bytes of rows g and g+8 and their scales' piece
// (word p: pair p of row g in its low half, of row g + 8 in its high half).
struct AChunk {
  uint4 w[2][4];
  uint4 s;
};

struct ARows {
  const uint8_t* w[2];  // rows g and g+8 of the lane's warp (of one block), chunk 0
  const uint8_t* s;     // their scale piece, chunk 0
};

__device__ __forceinline__ void load_a(AChunk& a, const ARows& rows, int chunk) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint4* w = reinterpret_cast<const uint4*>(rows.w[r] + chunk * kNvfp4TileCodeBytes);
#pragma unroll
    for (int v = 0; v < 4; ++v) a.w[r][v] = __ldg(w + v);
  }
  a.s = __ldg(reinterpret_cast<const uint4*>(rows.s + chunk * kNvfp4TileScaleBytes));
}

// The chunk's 8 k-steps of A fragments for this lane (pair = nvfp4_pair_decode(t)).
__device__ __forceinline__ void decode_a(const AChunk& a, const Nvfp4PairDecode& pair, uint32_t (&frag)[8][4]) {
  uint32_t sc[2][8];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int p = 0; p < 4; ++p) scale_pair_to_bf16x2(word(a.s, p) >> (16 * r), sc[r][2 * p], sc[r][2 * p + 1]);
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4& v = a.w[r][j >> 1];
      const uint32_t lo = word(v, 2 * (j & 1)), hi = word(v, 2 * (j & 1) + 1);
      frag[j][r] = bf16x2_mul(nvfp4_pair_raw(lo, pair), sc[r][j]);      // k 2t, 2t+1
      frag[j][2 + r] = bf16x2_mul(nvfp4_pair_raw(hi, pair), sc[r][j]);  // k 2t+8, 2t+9
    }
}

// Copies the activations of one chunk for the item's kN token slots into a stage: row r of
// the tile is token slot r, its 128 values are two 128-byte swizzle rows (K-atoms) kN * 128
// bytes apart, and 16-byte unit c of a swizzle row sits at unit c ^ (r % 8).
template <int kN>
__device__ __forceinline__ void load_b(uint32_t stage, const uint16_t* const* rows,
                                       const uint16_t* any, int chunk) {
  constexpr int kUnits = kN * kRowBytes / 16;
  static_assert(kUnits % kThreads == 0, "every thread copies the same number of units");
#pragma unroll
  for (int i = 0; i < kUnits / kThreads; ++i) {
    const int q = int(threadIdx.x) + i * kThreads;
    const int r = q >> 4, u = q & 15, atom = u >> 3, c = u & 7;
    const uint16_t* src = rows[r];
    const uint32_t dst = stage + atom * (kN * 128) + r * 128 + ((c ^ (r & 7)) << 4);
    cp_async_16(dst, src ? src + chunk * kMoeChunkK + u * 8 : any, src != nullptr);
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

// acc[64 rows x kN tokens] of this warpgroup over the whole K. Rows g and g+8 of each warp
// are given by `arows`. A chunk's fragments are decoded while the previous chunk's MMAs run
// (two fragment sets, alternating), and its weights are loaded two chunks ahead. The wgmma
// group is retired before the next barrier, so ptxas sees no register written under an
// outstanding group that reads it (else it serializes the wgmmas, warning C7513).
template <int kN>
__device__ __forceinline__ void gemm_block(const ARows& arows, const uint16_t* const* brows,
                                           const uint16_t* any, int n_chunks, uint32_t smem,
                                           float (&acc)[TileShape<kN>::kAcc]) {
  using S = TileShape<kN>;
#pragma unroll
  for (int i = 0; i < S::kAcc; ++i) acc[i] = 0.0f;
  const Nvfp4PairDecode pair = nvfp4_pair_decode(threadIdx.x & 3);
  // Prefetch distance kStages - 1: the slot refilled at chunk c held chunk c - 1, whose MMAs
  // every warpgroup has finished before the barrier.
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < n_chunks) load_b<kN>(smem + s * S::kStageBytes, brows, any, s);
    cp_async_commit();
  }
  AChunk next;
  uint32_t frag[2][8][4];
  load_a(next, arows, 0);
  decode_a(next, pair, frag[0]);
  if (n_chunks > 1) load_a(next, arows, 1);
  for (int c = 0; c < n_chunks; c += 2) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // unrolled so that frag[half] is a fixed register set
      const int cc = c + half;
      if (cc >= n_chunks) break;
      cp_async_wait<S::kStages - 2>();
      wgmma::fence_proxy_async();  // cp.async -> wgmma reads
      __syncthreads();
      const int pre = cc + S::kStages - 1;
      if (pre < n_chunks) load_b<kN>(smem + (pre % S::kStages) * S::kStageBytes, brows, any, pre);
      cp_async_commit();
      mma_issue<kN>(acc, frag[half], smem + (cc % S::kStages) * S::kStageBytes);
      if (cc + 1 < n_chunks) {
        decode_a(next, pair, frag[half ^ 1]);
        if (cc + 2 < n_chunks) load_a(next, arows, cc + 2);
      }
      wgmma::wait<0>();
      wgmma::fence_acc(acc);
    }
  }
}

// The shared prologue: the item, this thread's warpgroup row base and the token row table.
template <int kN>
__device__ __forceinline__ bool setup_block(const MoeGemmParams& p, MoeWorkItem& item,
                                            const uint16_t** brows, uint32_t& smem) {
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
  smem = (static_cast<uint32_t>(__cvta_generic_to_shared(dsmem)) + 1023u) & ~1023u;
  __syncthreads();
  return true;
}

// row_g: the lane's row g, in rows 0..7 of its block (row g + 8 is the same block's).
__device__ __forceinline__ ARows a_rows(const MoeGemmParams& p, int expert, int row_g) {
  const uint8_t* w = p.w + expert * p.w_expert_bytes + nvfp4_tiled_code_offset(row_g, 0, p.k);
  const uint8_t* s = p.w_scale + expert * p.s_expert_bytes +
                     nvfp4_tile_block(row_g, 0, p.k) * kNvfp4TileScaleBytes + nvfp4_row_scales_offset(row_g);
  return ARows{{w, w + kNvfp4TileHalfBytes}, s};
}

// One work item's GEMM for 64 rows per warpgroup. Gate/up (kGateUp): h = silu(x W_gate^T) *
// (x W_up^T); warp w of warpgroup wg owns h columns n0 + 8w .. n0 + 8w + 7, one tile of the
// interleaved gate/up matrix: its fragment row g is the gate row of column n0 + 8w + g and
// row g + 8 the up row of the same column, so SiLU x up meets in one thread. Down: y =
// h W_down^T; warp w owns output columns n0 + 16w .. n0 + 16w + 15. Either way a lane's two
// rows are one block's rows g and g + 8, whose scales share one piece.
template <int kN, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) wgmma_kernel(MoeGemmParams p) {
  __shared__ const uint16_t* brows[kN];
  MoeWorkItem item;
  uint32_t smem;
  pdl_wait();
  pdl_launch_dependents();
  if (!setup_block<kN>(p, item, brows, smem)) return;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int col = kGateUp ? (blockIdx.x * kWgs + wg) * 32 + 8 * warp + g
                          : (blockIdx.x * kWgs + wg) * 64 + 16 * warp + g;
  const int row_g = kGateUp ? int(nvfp4_gate_up_row(col, false)) : col;
  const ARows arows = a_rows(p, item.expert, row_g);
  float acc[TileShape<kN>::kAcc];
  gemm_block<kN>(arows, brows, p.b, p.k / kMoeChunkK, smem, acc);

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
