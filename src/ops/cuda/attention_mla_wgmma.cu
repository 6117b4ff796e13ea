// MLA attention on wgmma (sm_90a): 64 query rows a block, for groups of at least 64 rows (a
// decode token's 64 or 128 heads, or a prompt's (token, head) rows); see attention_mla.h.
//
// At 64 heads a token needs about 120 flops a byte of latent it reads, so the mma.sync kernel
// is bound by its MMA issue rate, not by bytes. Here one latent tile feeds 64 rows of
// tensor-core work from shared memory, as FlashMLA does:
//   - Q (64 x 576) and two stages of 64-key cache tiles (64 x 576 each) sit in shared memory,
//     128-byte swizzled, filled by cp.async (the keys are gathered by slot, one row each);
//   - warpgroup 0 scores S = Q K^T (36 k-steps of m64n64k16), runs the online softmax in its
//     accumulators, and leaves P (BF16) and each row's rescale factor in shared memory;
//   - both warpgroups rescale and accumulate their half of the output dims, O += P V, V being
//     the first 512 values of the same tile read as an MN-major operand (m64n256k16, 4 k-steps).
// Two barriers a tile: the tile has landed (and the previous one is consumed), and P is ready.
// The next tile's copy is in flight through all of it. Splits leave (max, sum, unnormalized
// output) for the combine kernel, as the tiled kernel does.
#include <cuda_bf16.h>

#include "ops/cuda/attention_mla_internal.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_sync.cuh"
#include "ops/cuda/wgmma.cuh"

namespace tetra::ops::cuda::mla {
namespace {

constexpr int kRows = kWgmmaRows;
constexpr int kThreads = 256;                        // two warpgroups
constexpr int kUnits = kWidth / 8;                   // 16-byte units of a cache row: 72
constexpr int kAtoms = kWidth / 64;                  // 64-value (128-byte) column blocks: 9
constexpr int kAtomBytes = kKeys * 128;              // one column block of 64 rows
constexpr int kTileBytes = kAtoms * kAtomBytes;      // 73,728: Q, or one stage of keys
constexpr int kHalfDims = kRank / 2;                 // output dims a warpgroup accumulates
constexpr int kStages = 2, kSlotBuffers = 3;
constexpr int kStageOffset = kTileBytes;             // Q first
constexpr int kPOffset = kStageOffset + kStages * kTileBytes;
constexpr int kAlphaOffset = kPOffset + kRows * kKeys * 2;
constexpr int kSumOffset = kAlphaOffset + kRows * 4;
constexpr int kSlotsOffset = kSumOffset + kRows * 4;
constexpr int kSmemBytes = kSlotsOffset + kSlotBuffers * kKeys * 4 + 1024;  // + alignment slack
static_assert(kRows == kKeys, "Q and a key tile share one layout");
static_assert(kSmemBytes <= 227 * 1024, "one block fits an SM");
static_assert(kKeys <= kThreads, "one thread finds each key's slot");

// 16-byte unit u of row r of a [64 x 576] tile, in bytes from the tile.
__device__ __forceinline__ uint32_t unit_offset(int r, int u) {
  return uint32_t((u / 8) * kAtomBytes) + wgmma::swizzled(r, u % 8);
}

__device__ __forceinline__ void load_q(const MlaArgs& a, const Work& w, uint32_t q_smem) {
  const int H = a.p.n_heads;
  for (int i = int(threadIdx.x); i < kRows * kUnits; i += kThreads) {
    const int r = i / kUnits, u = i % kUnits, row = w.row0 + r;
    const bool valid = row < w.n_rows;
    const uint16_t* src = a.p.q_latent;
    if (valid) {
      const int64_t qrow = int64_t(w.token_begin + row / H) * H + row % H;
      src = u < kRank / 8 ? a.p.q_latent + qrow * kRank + 8 * u : a.p.q_rope + qrow * kRope + 8 * (u - kRank / 8);
    }
    cp_async_16(q_smem + unit_offset(r, u), src, valid);
  }
}

__device__ __forceinline__ void copy_tile(const MlaArgs& a, const int32_t* slots, uint32_t tile) {
#pragma unroll 6
  for (int i = int(threadIdx.x); i < kKeys * kUnits; i += kThreads) {
    const int r = i / kUnits, u = i % kUnits, slot = slots[r];
    const uint16_t* src = slot >= 0 ? a.p.cache + int64_t(slot) * kWidth + 8 * u : a.p.cache;
    cp_async_16(tile + unit_offset(r, u), src, slot >= 0);
  }
}

__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_kernel(const MlaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t q_smem = base, p_smem = base + kPOffset;
  const auto stage_smem = [&](int s) { return base + kStageOffset + uint32_t(s * kTileBytes); };
  float* alpha_smem = reinterpret_cast<float*>(smem + kAlphaOffset);
  float* sum_smem = reinterpret_cast<float*>(smem + kSumOffset);
  const auto slots = [&](int s) { return reinterpret_cast<int32_t*>(smem + kSlotsOffset) + s * kKeys; };
  const int tid = int(threadIdx.x), wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int H = a.p.n_heads;

  Work w = block_group(a);
  const int tile_stride = int(gridDim.x) / a.n_splits;
  for (int row_tile = int(blockIdx.x) / a.n_splits; row_tile * kRows < w.n_rows; row_tile += tile_stride) {
    w.row0 = row_tile * kRows;
    // This thread's accumulator rows, 16 warp + g and + 8, and the last key each sees.
    int local_row[2], row_token[2], row_head[2], key_limit[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      local_row[r] = 16 * warp + g + 8 * r;
      key_limit[r] = row_key_limit(a, w, w.row0 + local_row[r], row_token[r], row_head[r]);
    }
    const int n_tiles = split_keys(a, w, kRows);

    float o[kHalfDims / 2];
#pragma unroll
    for (int i = 0; i < kHalfDims / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // warpgroup 0's

    if (n_tiles > 0) {
      if (tid < kKeys) {
        slots(0)[tid] = slot_of_key(a, w, w.key_begin + tid);
        slots(1)[tid] = slot_of_key(a, w, w.key_begin + kKeys + tid);
      }
      load_q(a, w, q_smem);
      __syncthreads();  // the slots of tiles 0 and 1
      copy_tile(a, slots(0), stage_smem(0));
      cp_async_commit();  // Q and tile 0
    }
    for (int it = 0; it < n_tiles; ++it) {
      const int next = it + 1;
      const uint32_t tile = stage_smem(it % kStages);
      cp_async_wait<0>();
      wgmma::fence_proxy_async();
      // Tile it landed for every thread; both warpgroups are past tile it - 1's P V, so the
      // other stage, P and the rescale factors are free.
      __syncthreads();
      if (next < n_tiles) copy_tile(a, slots(next % kSlotBuffers), stage_smem(next % kStages));
      cp_async_commit();
      // Tile it + 2's slots take the buffer of tile it - 1 (done with at its mask and copy).
      if (tid < kKeys) slots((it + 2) % kSlotBuffers)[tid] = slot_of_key(a, w, w.key_begin + (it + 2) * kKeys + tid);

      if (wg == 0) {
        float s[kKeys / 2];
#pragma unroll
        for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < kWidth / 16; ++kk) {
          const uint32_t at = uint32_t((kk / 4) * kAtomBytes + (kk % 4) * 32);
          wgmma::mma_ss<0>(s, wgmma::desc_k_major(q_smem + at), wgmma::desc_k_major(tile + at));
        }
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_acc(s);
        const int key0 = w.key_begin + it * kKeys;
        const int32_t* tile_slots = slots(it % kSlotBuffers);
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < kKeys / 2; ++i) {
          const int k = 8 * (i / 4) + 2 * t4 + (i & 1), r = (i / 2) & 1;
          float x = s[i] * a.scale_log2;
          if (tile_slots[k] < 0 || key0 + k > key_limit[r]) x = -INFINITY;
          s[i] = x;
          tile_max[r] = fmaxf(tile_max[r], x);
        }
        float base_r[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
          base_r[r] = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: exp2(-inf - 0) = 0, not NaN
          alpha[r] = exp2_approx(m[r] - base_r[r]);
          m[r] = m_new;
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
        // P as the K-major A operand of P V: row r's keys 8j .. 8j + 7 are its 16-byte unit j.
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            *reinterpret_cast<uint32_t*>(smem + kPOffset + wgmma::swizzled(local_row[r], j) + 4 * t4) =
                pack_bf16x2(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
        if (t4 == 0) {
          alpha_smem[local_row[0]] = alpha[0];
          alpha_smem[local_row[1]] = alpha[1];
        }
        wgmma::fence_proxy_async();
      }
      __syncthreads();  // P and the rescale factors
      const float alpha[2] = {alpha_smem[local_row[0]], alpha_smem[local_row[1]]};
#pragma unroll
      for (int i = 0; i < kHalfDims / 2; ++i) o[i] *= alpha[(i / 2) & 1];
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
        wgmma::mma_ss<1>(o, wgmma::desc_k_major(p_smem + kk * 32),
                         wgmma::desc_mn_major(tile + wg * (kHalfDims / 64) * kAtomBytes + kk * 16 * 128, kAtomBytes));
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_acc(o);
    }

    if (wg == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] = quad_sum(l[r]);
        if (t4 == 0) sum_smem[local_row[r]] = l[r];
      }
    }
    __syncthreads();  // the row sums
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (key_limit[r] < 0) continue;
      const int64_t out_row = int64_t(row_token[r]) * H + row_head[r];
      if (a.n_splits > 1) {
        const int64_t part = out_row * a.n_splits + w.split;
        float* dst = a.partial_acc + part * kRank + wg * kHalfDims;
#pragma unroll
        for (int j = 0; j < kHalfDims / 8; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j + 2 * t4) = make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
        if (wg == 0 && t4 == 0) a.partial_ml[part] = make_float2(m[r], l[r]);
      } else {
        const float sum = sum_smem[local_row[r]];
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // no key at all: 0
        uint16_t* dst = a.p.out + out_row * kRank + wg * kHalfDims;
#pragma unroll
        for (int j = 0; j < kHalfDims / 8; ++j)
          *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t4) =
              pack_bf16x2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      }
    }
    __syncthreads();  // Q, the stages, the slots and the row sums are refilled for the next row tile
  }
}

}  // namespace

void launch_mla_wgmma(const KernelLaunch& launch, const MlaArgs& a, dim3 grid) {
  static const bool raised = [] {  // once per process (for the current device)
    TETRA_CUDA_CHECK(cudaFuncSetAttribute(mla_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)raised;
  launch_kernel(launch, mla_wgmma_kernel, grid, kThreads, kSmemBytes, a);
  TETRA_CUDA_CHECK_LAUNCH("mla_attention wgmma");
}

}  // namespace tetra::ops::cuda::mla
