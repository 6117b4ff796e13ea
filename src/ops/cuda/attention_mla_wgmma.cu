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
//   - warpgroup 1 meanwhile issues the copy of the next tile, and finds the slots of the one
//     after while its MMAs run, so neither the copies nor the block-table reads wait on the
//     scores;
//   - both warpgroups rescale (only when a row's maximum grew by more than wgmma_softmax.cuh's
//     slack) and
//     accumulate their half of the output dims, O += P V, V being the first 512 values of the
//     same tile read as an MN-major operand (m64n256k16, 4 k-steps).
// Two barriers a tile: the tile has landed (and the previous one is consumed), and P is ready.
// An FP8 cache (the kernel's FP8 instance) keeps one BF16 tile, where stage 0 was, and two
// staged E4M3 tiles in the room of stage 1: all 256 threads copy tile it + 1's bytes, widen
// tile it's into the BF16 tile, and meet at a third barrier before the scores.
// Splits leave (max, sum, unnormalized output) for the combine kernel, as the tiled kernel does,
// or, when a row tile's 2, 4 or 8 splits run as one cluster (the plan's cluster_merge), put
// them in their shared memory, and each block merges its share of the rows from all of them.
#include <cuda_bf16.h>

#include <array>

#include "ops/cuda/attention_mla_internal.cuh"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_sync.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/cuda/wgmma_softmax.cuh"

namespace tetra::ops::cuda::mla {
namespace {

constexpr int kRows = kWgmmaRows;
constexpr int kThreads = 256;                        // two warpgroups
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
constexpr int kHasKeyOffset = kSlotsOffset + kSlotBuffers * kKeys * 4;
constexpr int kSmemBytes = kHasKeyOffset + kSlotBuffers * (kKeys / 32) * 4 + 1024;  // + alignment slack
static_assert(kRows == kKeys, "Q and a key tile share one layout");
static_assert(kSmemBytes <= 227 * 1024, "one block fits an SM");
static_assert(kKeys <= kThreads, "one thread finds each key's slot");
// The cluster merge: a row of unnormalized outputs (f32) every kMergeStride floats over the
// stages, so that the 8 rows a warp writes at once fall in different banks; (max, sum) over P.
constexpr int kMergeStride = kRank + 4;
constexpr int kMaxCluster = 8;
static_assert(kRows * kMergeStride * 4 <= kStages * kTileBytes && kRows * 8 <= kRows * kKeys * 2,
              "the merge's buffers fit the stages and P");
// An FP8 cache: the BF16 tile at stage 0, the two E4M3 stages after it.
constexpr int kFp8StagingOffset = kStageOffset + kTileBytes;
static_assert(kTileBytes + 2 * kFp8TileBytes <= kStages * kTileBytes, "the E4M3 stages fit stage 1's room");

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// `addr` in the shared memory of block `rank` of this cluster.
__device__ __forceinline__ uint32_t cluster_addr(uint32_t addr, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float2 ld_cluster_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Block `split` of a cluster of n = a.n_splits writes the outputs of rows split * 64 / n ..:
// out = sum_i 2^(m_i - M) o_i / sum_i 2^(m_i - M) l_i over the cluster's blocks, in block order
// (as the combine kernel sums splits), from the buffers every block left in its shared memory.
__device__ __forceinline__ void merge_cluster_rows(const MlaArgs& a, const Work& w, uint32_t o_smem, uint32_t ml_smem) {
  const int n = a.n_splits, rows = kRows / n;
  for (int item = int(threadIdx.x); item < rows * (kRank / 4); item += kThreads) {
    const int row = w.split * rows + item / (kRank / 4), d = 4 * (item % (kRank / 4));
    int token, head;
    if (row_key_limit(a, w, w.row0 + row, token, head) < 0) continue;
    float2 ml[kMaxCluster];
    float m_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxCluster; ++i) {
      if (i >= n) break;
      ml[i] = ld_cluster_f2(cluster_addr(ml_smem + uint32_t(row * 8), i));
      m_max = fmaxf(m_max, ml[i].x);
    }
    float l_sum = 0.0f;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < kMaxCluster; ++i) {
      if (i >= n) break;
      const float wt = ml[i].x == -INFINITY ? 0.0f : exp2_approx(ml[i].x - m_max);  // no key: nothing
      l_sum += wt * ml[i].y;
      const float4 v = ld_cluster_f4(cluster_addr(o_smem + uint32_t((row * kMergeStride + d) * 4), i));
      o.x += wt * v.x, o.y += wt * v.y, o.z += wt * v.z, o.w += wt * v.w;
    }
    const float inv = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;
    *reinterpret_cast<uint2*>(a.p.out + (int64_t(token) * a.p.n_heads + head) * kRank + d) =
        make_uint2(pack_bf16x2(o.x * inv, o.y * inv), pack_bf16x2(o.z * inv, o.w * inv));
  }
}

// Copier t of kCopiers copies 16-byte unit c = t % 8 of every 128-byte column block of the
// rows t / 8 + i kCopiers / 8: offsets fixed at compile time from one pointer a row. A warp
// reads four whole 128-byte lines at a time.
template <int kCopiers>
struct RowCopy {
  static constexpr int kStride = kCopiers / 8, kPerThread = kRows / kStride;  // rows
  const uint16_t* latent[kPerThread];
  const uint16_t* rope[kPerThread];
  bool valid[kPerThread];

  __device__ __forceinline__ static int row(int t, int i) { return t / 8 + i * kStride; }

  __device__ __forceinline__ void issue(int t, uint32_t tile) const {
    const int c = t % 8;
    const uint32_t dst = tile + wgmma::swizzled(t / 8, c);  // rows kStride (a multiple of 8) apart swizzle alike
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
#pragma unroll
      for (int atom = 0; atom < kAtoms - 1; ++atom)
        cp_async_16(dst + atom * kAtomBytes + i * kStride * 128, latent[i] + atom * 64 + 8 * c, valid[i]);
      cp_async_16(dst + (kAtoms - 1) * kAtomBytes + i * kStride * 128, rope[i] + 8 * c, valid[i]);
    }
  }
};
static_assert(kRank == (kAtoms - 1) * 64 && kRope == 64, "8 column blocks of latent, one of rope");

// Q of the row tile, by all threads.
__device__ __forceinline__ void load_q(const MlaArgs& a, const Work& w, uint32_t q_smem) {
  const int H = a.p.n_heads, t = int(threadIdx.x);
  RowCopy<kThreads> copy;
#pragma unroll
  for (int i = 0; i < copy.kPerThread; ++i) {
    const int row = w.row0 + copy.row(t, i);
    copy.valid[i] = row < w.n_rows;
    const int64_t qrow = copy.valid[i] ? int64_t(w.token_begin + row / H) * H + row % H : 0;
    copy.latent[i] = a.p.q_latent + qrow * kRank;
    copy.rope[i] = a.p.q_rope + qrow * kRope;
  }
  copy.issue(t, q_smem);
}

// A key tile, by warpgroup 1 (t: its thread).
__device__ __forceinline__ void copy_tile(const MlaArgs& a, const int32_t* slots, uint32_t tile, int t) {
  RowCopy<128> copy;
#pragma unroll
  for (int i = 0; i < copy.kPerThread; ++i) {
    const int slot = slots[copy.row(t, i)];
    copy.valid[i] = slot >= 0;
    copy.latent[i] = static_cast<const uint16_t*>(a.p.cache) + (copy.valid[i] ? int64_t(slot) * kWidth : 0);
    copy.rope[i] = copy.latent[i] + kRank;
  }
  copy.issue(t, tile);
}

// The slots of a tile's keys (-1: no key), and a bit per key that has one; threads t < 64 of
// warpgroup 1.
__device__ __forceinline__ void find_slots(const MlaArgs& a, const Work& w, int first_key, int32_t* slots,
                                           uint32_t* has_key, int t) {
  if (t >= kKeys) return;  // whole warps
  const int slot = slot_of_key(a, w, first_key + t);
  slots[t] = slot;
  const uint32_t bits = __ballot_sync(0xffffffffu, slot >= 0);
  if (t % 32 == 0) has_key[t / 32] = bits;
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_kernel(const MlaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t q_smem = base, p_smem = base + kPOffset;
  const auto stage_smem = [&](int s) { return base + kStageOffset + uint32_t(s * kTileBytes); };
  const auto fp8_stage = [&](int s) { return base + kFp8StagingOffset + uint32_t(s * kFp8TileBytes); };
  float* alpha_smem = reinterpret_cast<float*>(smem + kAlphaOffset);
  float* sum_smem = reinterpret_cast<float*>(smem + kSumOffset);
  const auto slots = [&](int s) { return reinterpret_cast<int32_t*>(smem + kSlotsOffset) + s * kKeys; };
  const auto has_key = [&](int s) { return reinterpret_cast<uint32_t*>(smem + kHasKeyOffset) + s * (kKeys / 32); };
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
      if (wg == 1) {
        find_slots(a, w, w.key_begin, slots(0), has_key(0), tid - 128);
        find_slots(a, w, w.key_begin + kKeys, slots(1), has_key(1), tid - 128);
      }
      load_q(a, w, q_smem);
      __syncthreads();  // the slots of tiles 0 and 1
      if constexpr (kFp8) copy_fp8_tile<kThreads>(a, slots(0), fp8_stage(0), tid);
      else if (wg == 1) copy_tile(a, slots(0), stage_smem(0), tid - 128);
      cp_async_commit();  // Q and tile 0
    }
    for (int it = 0; it < n_tiles; ++it) {
      const int next = it + 1;
      const uint32_t tile = stage_smem(kFp8 ? 0 : it % kStages);
      cp_async_wait<0>();
      wgmma::fence_proxy_async();
      // Tile it landed for every thread; both warpgroups are past tile it - 1's P V, so the
      // other stage (an FP8 cache: the BF16 tile and the other E4M3 stage), P and the rescale
      // factors are free.
      __syncthreads();
      if constexpr (kFp8) {
        if (next < n_tiles) copy_fp8_tile<kThreads>(a, slots(next % kSlotBuffers), fp8_stage(next % 2), tid);
        cp_async_commit();
        widen_fp8_tile<kThreads>(
            smem + (fp8_stage(it % 2) - base),
            [&](int r, int unit) { return tile + uint32_t(unit / 8 * kAtomBytes) + wgmma::swizzled(r, unit % 8); }, tid);
        wgmma::fence_proxy_async();  // the widened tile, for the MMAs' async proxy
        __syncthreads();
      } else {
        // Warpgroup 1 copies tile it + 1 while warpgroup 0 scores tile it.
        if (wg == 1 && next < n_tiles) copy_tile(a, slots(next % kSlotBuffers), stage_smem(next % kStages), tid - 128);
        cp_async_commit();
      }

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
        // Key k = 8 (i / 4) + 2 t4 + (i & 1) of accumulator i: its bit of the mask, and the
        // rows' last keys, are shifted by 2 t4 once.
        const uint32_t* bits = has_key(it % kSlotBuffers);
        const uint64_t keys = (uint64_t(bits[0]) | uint64_t(bits[1]) << 32) >> (2 * t4);
        const int key0 = w.key_begin + it * kKeys;
        const int last[2] = {key_limit[0] - key0 - 2 * t4, key_limit[1] - key0 - 2 * t4};
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < kKeys / 2; ++i) {
          const int k = 8 * (i / 4) + (i & 1), r = (i / 2) & 1;
          const float x = ((keys >> k) & 1) && k <= last[r] ? s[i] * a.scale_log2 : -INFINITY;
          s[i] = x;
          tile_max[r] = fmaxf(tile_max[r], x);
        }
        const float2 factor = wgmma::softmax_tile(s, tile_max, m, l);
        const float alpha[2] = {factor.x, factor.y};
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
      if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
        for (int i = 0; i < kHalfDims / 2; ++i) o[i] *= alpha[(i / 2) & 1];
      }
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
        wgmma::mma_ss<1>(o, wgmma::desc_k_major(p_smem + kk * 32),
                         wgmma::desc_mn_major(tile + wg * (kHalfDims / 64) * kAtomBytes + kk * 16 * 128, kAtomBytes));
      wgmma::commit();
      // Tile it + 2's slots, while the MMAs run, take the buffer of tile it - 1 (done with at
      // its mask and copy); their global reads stay off warpgroup 0's path.
      if (wg == 1)
        find_slots(a, w, w.key_begin + (it + 2) * kKeys, slots((it + 2) % kSlotBuffers),
                   has_key((it + 2) % kSlotBuffers), tid - 128);
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
    __syncthreads();  // the row sums; every MMA is done with the stages
    if (a.cluster_merge) {
      float* o_smem = reinterpret_cast<float*>(smem + kStageOffset);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < kHalfDims / 8; ++j)
          *reinterpret_cast<float2*>(o_smem + local_row[r] * kMergeStride + wg * kHalfDims + 8 * j + 2 * t4) =
              make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
      if (wg == 0 && t4 == 0) {
        float2* ml_smem = reinterpret_cast<float2*>(smem + kPOffset);
        ml_smem[local_row[0]] = make_float2(m[0], l[0]);
        ml_smem[local_row[1]] = make_float2(m[1], l[1]);
      }
      cluster_sync();  // every split's outputs are in its shared memory
      merge_cluster_rows(a, w, base + kStageOffset, base + kPOffset);
      cluster_sync();  // no block refills its shared memory, or exits, while another reads it
      continue;
    }
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

namespace {
// How many clusters of 2, 4 and 8 of the kernel's blocks the GPU holds at once: asked once per
// process, of the first device that asks (a process's GPUs are of one kind), after allowing the
// kernel its shared memory there (launch_kernel allows it at every launch, on any device).
const std::array<int, kMaxCluster + 1>& max_clusters_of_gpu() {
  static const std::array<int, kMaxCluster + 1> max_clusters = [] {
    // Both instances take the same shared memory and threads, so the BF16 one answers for both.
    TETRA_CUDA_CHECK(
        cudaFuncSetAttribute(mla_wgmma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    std::array<int, kMaxCluster + 1> m{};
    for (int c = 2; c <= kMaxCluster; c *= 2) {
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim = {unsigned(c), 1, 1};
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(c));
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = kSmemBytes;
      config.attrs = &attr;
      config.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&m[size_t(c)], mla_wgmma_kernel<false>, &config) != cudaSuccess) {
        cudaGetLastError();
        m[size_t(c)] = 0;
      }
    }
    return m;
  }();
  return max_clusters;
}
}  // namespace

bool mla_wgmma_clusters_fit(int cluster, int64_t blocks) {
  if (cluster < 2 || cluster > kMaxCluster || kRows % cluster != 0) return false;
  return int64_t(max_clusters_of_gpu()[size_t(cluster)]) * cluster >= blocks;
}

void launch_mla_wgmma(const KernelLaunch& launch, const MlaArgs& a, dim3 grid) {
  launch_kernel_in_clusters(launch, a.cluster_merge ? unsigned(a.n_splits) : 1u,
                            a.p.fp8_cache ? mla_wgmma_kernel<true> : mla_wgmma_kernel<false>, grid, kThreads,
                            kSmemBytes, a);
  TETRA_CUDA_CHECK_LAUNCH("mla_attention wgmma");
}

}  // namespace tetra::ops::cuda::mla
