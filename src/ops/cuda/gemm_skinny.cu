#include "ops/cuda/gemm_skinny.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <climits>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_sync.cuh"
#include "ops/cuda/wgmma.cuh"

namespace tetra::ops::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;               // one warpgroup
constexpr int kRows = 64;                   // W rows a block: wgmma's M
constexpr int kChunk = 64;                  // K values a stage: one 128-byte swizzle row
constexpr int kWTileBytes = kRows * 128;    // W's 64 rows of one chunk
// Clusters of up to 6 blocks: 7 and 8 (the portable limit) measured 15-25% slower at GLM-5's
// q_a + kv_a (n_in 6144) than 6, with 2 and 3 blocks an SM (docs/PERF.md).
constexpr int kMaxSplit = 6;
constexpr int kChunksPerBlock = 11;         // about 88 KB of W a block
// Three blocks an SM (an SM has 228 KB, of which the driver keeps 1 KB a block). Against one
// block with a 13-22 deep ring or two with 6-11, three and four measured fastest (docs/PERF.md):
// a block's loop stops at a barrier each chunk (its MMAs left in flight across it did not
// help), so blocks side by side overlap what one block serializes.
constexpr int kBlocksPerSm = 3;
constexpr int kSmemBudget = 74 * 1024;

// x's tokens padded to wgmma's N (16, 32 or 64): stage = W's tile, then x's N rows.
template <int kN>
struct Shape {
  static constexpr int kStageBytes = kWTileBytes + kN * 128;
  static constexpr int kStages = (kSmemBudget - 1024) / kStageBytes;  // 7, 6, 4
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;     // + alignment slack
  static constexpr int kAcc = kN / 2;  // f32 accumulators a thread: 64 x kN / 128
};

constexpr int kMaxParts = 4;
struct SkinnyPart {
  const uint16_t* w;
  const void* bias;
  DType bdt;
  void* out;
  int n_out, tile0;  // this part's tiles are tile0 .. tile0 + ceil(n_out / 64) - 1
};
struct SkinnyParams {
  SkinnyPart p[kMaxParts];
  int n_parts;
  const uint16_t* x;
  int n_tokens, n_in, split;
  DType odt;
};

// Block (tile, rank): rows n0..n0+63 of its part against chunks [c_begin, c_begin + n_chunks)
// of K. Stage s holds W's tile (row-major W is K-major A) and x's (token rows, K-major B).
// W is fixed at load, so the ring's first chunks of W are requested before pdl_wait, while
// the kernel before this one still runs; x only after it.
template <int kN>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) skinny_kernel(const SkinnyParams p) {
  using S = Shape<kN>;
  extern __shared__ uint8_t dsmem[];
  uint8_t* base = dsmem + ((1024u - (smem_addr(dsmem) & 1023u)) & 1023u);
  const uint32_t smem = smem_addr(base);
  const int tid = threadIdx.x;
  const int tile = int(blockIdx.x) / p.split, rank = int(blockIdx.x) % p.split;
  int k = 0;
  while (k + 1 < p.n_parts && tile >= p.p[k + 1].tile0) ++k;
  const SkinnyPart& part = p.p[k];
  const int n0 = (tile - part.tile0) * kRows;
  const int chunks = p.n_in / kChunk;
  const int c_begin = rank * chunks / p.split, n_chunks = (rank + 1) * chunks / p.split - c_begin;
  const int T = p.n_tokens;

  // x's rows T..kN-1 are never loaded: zero them once in every stage (they only feed
  // outputs that are not stored, but stale bytes could be NaN).
  {
    const int zero_units = (kN - T) * 8;
    for (int q = tid; q < S::kStages * zero_units; q += kThreads) {
      const uint32_t dst = smem + (q / zero_units) * S::kStageBytes + kWTileBytes + T * 128 + (q % zero_units) * 16;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(dst), "r"(0) : "memory");
    }
  }

  // This thread's 4 units of W a stage: unit q = tid + 128 i is row q / 8, 16-byte unit q % 8.
  const uint16_t* wsrc[4];
  uint32_t wdst[4];
  bool wvalid[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int q = tid + kThreads * i, r = q >> 3, u = q & 7;
    wvalid[i] = n0 + r < part.n_out;  // rows past n_out load zeros
    wsrc[i] = wvalid[i] ? part.w + int64_t(n0 + r) * p.n_in + int64_t(c_begin) * kChunk + u * 8 : part.w;
    wdst[i] = wgmma::swizzled(r, u);
  }
  const auto load_w = [&](int c) {
    const uint32_t stage = smem + (c % S::kStages) * S::kStageBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) cp_async_16(stage + wdst[i], wsrc[i] + (wvalid[i] ? c * kChunk : 0), wvalid[i]);
  };
  const auto load_x = [&](int c) {
    const uint32_t stage = smem + (c % S::kStages) * S::kStageBytes + kWTileBytes;
#pragma unroll
    for (int i = 0; i < (kN * 8 + kThreads - 1) / kThreads; ++i) {
      const int q = tid + kThreads * i, r = q >> 3, u = q & 7;
      if (r < T) cp_async_16(stage + wgmma::swizzled(r, u), p.x + int64_t(r) * p.n_in + (c_begin + c) * kChunk + u * 8, true);
    }
  };

  // Commit groups: W of chunks 0..kStages-2, then x of the same chunks, then one group (W and
  // x) per chunk of the loop. Before chunk c's MMAs, the groups after its x are the prologue's
  // x of chunks c+1..kStages-2 and the loop's c, kStages - 2 in all: wait_group kStages - 2.
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < n_chunks) load_w(s);
    cp_async_commit();
  }
  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < n_chunks) load_x(s);
    cp_async_commit();
  }

  float acc[S::kAcc];
#pragma unroll
  for (int i = 0; i < S::kAcc; ++i) acc[i] = 0.0f;
  for (int c = 0; c < n_chunks; ++c) {
    cp_async_wait<S::kStages - 2>();
    wgmma::fence_proxy_async();  // cp.async and st.shared -> wgmma's reads
    __syncthreads();             // every thread's copies of chunk c are in; chunk c-1's MMAs are done
    const int pre = c + S::kStages - 1;  // refills the slot chunk c-1 used
    if (pre < n_chunks) {
      load_w(pre);
      load_x(pre);
    }
    cp_async_commit();
    const uint32_t wa = smem + (c % S::kStages) * S::kStageBytes, xb = wa + kWTileBytes;
    wgmma::fence();
#pragma unroll
    for (int j = 0; j < kChunk / 16; ++j)
      wgmma::mma_ss<0>(acc, wgmma::desc_k_major(wa + 32 * j), wgmma::desc_k_major(xb + 32 * j));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_acc(acc);
  }
  cp_async_wait<0>();

  // The cluster's ranks add into rank 0, in rank order, through distributed shared memory:
  // float4 j of thread i at j * 128 + i (conflict-free), in the ring the MMAs are done with.
  if (p.split > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    float4* red = reinterpret_cast<float4*>(base);
    __syncthreads();
    if (rank != 0)
#pragma unroll
      for (int j = 0; j < S::kAcc / 4; ++j)
        red[j * kThreads + tid] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    cluster.sync();
    if (rank == 0)
      for (int r = 1; r < p.split; ++r) {
        const float4* remote = cluster.map_shared_rank(red, r);
#pragma unroll
        for (int j = 0; j < S::kAcc / 4; ++j) {
          const float4 v = remote[j * kThreads + tid];
          acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
        }
      }
    cluster.sync();  // rank 0 has read every rank's shared memory before any leaves
    if (rank != 0) return;
  }

  // wgmma.cuh's accumulator layout, M = W's rows and N = tokens: acc[4j + e] is row
  // n0 + 16 warp + g against token 8j + 2t + e, acc[4j + 2 + e] row n0 + 16 warp + g + 8.
  const int warp = tid >> 5, g = (tid & 31) >> 2, t = tid & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = n0 + 16 * warp + g + 8 * h;
    if (row >= part.n_out) continue;
    const float b = part.bias ? load_float(part.bias, row, part.bdt) : 0.0f;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int token = 8 * j + 2 * t + e;
        if (token < T) store_float(part.out, int64_t(token) * part.n_out + row, p.odt, acc[4 * j + 2 * h + e] + b);
      }
  }
}

template <int kN>
void launch_skinny(const KernelLaunch& launch, const SkinnyParams& p, int64_t blocks) {
  launch_kernel_in_clusters(launch, unsigned(p.split), skinny_kernel<kN>, unsigned(blocks), kThreads,
                            Shape<kN>::kSmemBytes, p);
}

bool qualifies(TensorView x, const LinearWeight& w, TensorView out) {
  if (w.format != WeightFormat::Dense || w.weight.dtype != DType::BF16 || x.dtype != DType::BF16) return false;
  if (out.dtype != DType::BF16 && out.dtype != DType::F32) return false;
  if (w.n_in % kChunk != 0 || w.n_in > INT_MAX / kSkinnyMaxTokens || w.n_out > INT_MAX / 2) return false;
  if (!aligned16(w.weight.data) || !aligned16(x.data)) return false;
  const int64_t t = x.numel() / w.n_in;
  return t >= 1 && t <= kSkinnyMaxTokens;
}

}  // namespace

int skinny_split(int64_t n_in) {
  return int(std::clamp<int64_t>(ceil_div(n_in / kChunk, kChunksPerBlock), 1, kMaxSplit));
}

bool gemm_skinny_bf16(const KernelLaunch& launch, TensorView x, std::span<const LinearPart> parts) {
  if (parts.empty() || int64_t(parts.size()) > kMaxParts) return false;
  const LinearWeight& w0 = *parts[0].weight;
  SkinnyParams p{};
  int64_t tiles = 0;
  for (const LinearPart& part : parts) {
    const LinearWeight& w = *part.weight;
    if (!qualifies(x, w, part.out) || w.n_in != w0.n_in || part.out.dtype != parts[0].out.dtype) return false;
    p.p[p.n_parts++] = {w.weight.as<const uint16_t>(), w.bias.empty() ? nullptr : w.bias.data, w.bias.dtype,
                        part.out.data, int(w.n_out), int(tiles)};
    tiles += ceil_div(w.n_out, kRows);
  }
  p.split = skinny_split(w0.n_in);
  if (tiles * p.split > INT_MAX) return false;
  p.x = x.as<const uint16_t>();
  p.n_tokens = int(x.numel() / w0.n_in);
  p.n_in = int(w0.n_in);
  p.odt = parts[0].out.dtype;
  if (p.n_tokens <= 16)
    launch_skinny<16>(launch, p, tiles * p.split);
  else if (p.n_tokens <= 32)
    launch_skinny<32>(launch, p, tiles * p.split);
  else
    launch_skinny<64>(launch, p, tiles * p.split);
  TETRA_CUDA_CHECK_LAUNCH("gemm_skinny_bf16");
  return true;
}

}  // namespace tetra::ops::cuda
