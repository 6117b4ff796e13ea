// The MoE layer's small kernels: routing (router logits -> top-k experts and weights),
// permutation (tokens grouped by expert into work items for the grouped GEMMs), and the
// weighted combine. All sizes come from device memory or launch arguments fixed by T, so a
// layer is capturable in a CUDA graph.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe_grouping.cuh"
#include "ops/cuda/moe_internal.h"

namespace tetra::ops::cuda {
namespace {

constexpr int kRouteWarps = 4;     // tokens per routing block, one warp each
constexpr int kPermuteThreads = 1024;
constexpr int kMaxExperts = 1024;  // routing keeps a token's E scores in shared memory

struct RouteParams {
  const float* logits;
  const float* bias;  // sigmoid only, may be null
  int* ids;
  float* weights;
  int n_tokens, n_experts, top_k;
  int n_group, topk_group;
  bool sigmoid, norm;
  float scaling;
};

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;  // ties go to the lower index
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp per token, FORMATS.md §2.2: scores (softmax, or sigmoid with the correction bias
// for selection only), optional group pruning, top-k, optional renormalization, scaling.
__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(RouteParams p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= p.n_tokens) return;  // whole warps leave; the kernel has no block barrier
  const int E = p.n_experts;
  float* score = route_smem + warp * 2 * E;  // the weights come from these
  float* sel = score + E;                    // and the choice from these
  const float* l = p.logits + int64_t(t) * E;

  if (!p.sigmoid) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float x = expf(l[e] - m);
      score[e] = x;
      sum += x;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int e = lane; e < E; e += 32) score[e] *= inv, sel[e] = score[e];
  } else {
    for (int e = lane; e < E; e += 32) {
      const float s = 1.0f / (1.0f + expf(-l[e]));
      score[e] = s;
      sel[e] = s + (p.bias ? p.bias[e] : 0.0f);
    }
  }
  __syncwarp();

  if (p.sigmoid && p.n_group > 1) {
    // Group score = sum of the group's two best biased scores; keep topk_group groups and
    // mask the others' selection scores with -inf, as transformers 5 does (older versions
    // used 0.0, which differs when biased scores go negative).
    const int per = E / p.n_group;
    float gscore = -INFINITY;
    if (lane < p.n_group) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = lane * per; e < (lane + 1) * per; ++e) {
        const float v = sel[e];
        if (v > b1) b2 = b1, b1 = v;
        else if (v > b2) b2 = v;
      }
      gscore = b1 + b2;
    }
    uint32_t keep = 0;
    for (int r = 0; r < p.topk_group; ++r) {
      float v = gscore;
      int i = lane;
      warp_argmax(v, i);
      keep |= 1u << i;
      if (lane == i) gscore = -INFINITY;
    }
    for (int e = lane; e < E; e += 32)
      if (!((keep >> (e / per)) & 1u)) sel[e] = -INFINITY;
    __syncwarp();
  }

  float my_weight = 0.0f;  // lane j keeps the weight of the j-th choice
  for (int j = 0; j < p.top_k; ++j) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int e = lane; e < E; e += 32)
      if (sel[e] > v) v = sel[e], i = e;  // strided scan: first hit is the lower index
    warp_argmax(v, i);
    if (i >= E) i = 0;  // only with NaN scores: keep the index in range
    if (lane == j) my_weight = score[i];
    if (lane == 0) {
      p.ids[int64_t(t) * p.top_k + j] = i;
      sel[i] = -INFINITY;
    }
    __syncwarp();
  }
  if (p.norm) {
    const float sum = warp_sum(lane < p.top_k ? my_weight : 0.0f);
    my_weight = p.sigmoid ? my_weight / (sum + 1e-20f) : my_weight / sum;
  }
  if (lane < p.top_k) p.weights[int64_t(t) * p.top_k + lane] = my_weight * p.scaling;
}

struct PermuteParams {
  const int* ids;  // [T, k]
  int n_tokens, top_k, first_expert, n_experts;
  bool shared;     // slot k of every token is the shared expert (id n_experts)
  int tile_tokens;
  int hot_tokens;  // 0, or the items of experts with more than tile_tokens rows (s.hot_items)
  MoeScratch s;
};

// One block: counts tokens per expert, lays the experts' rows out contiguously (expert
// order), cuts each expert's rows into work items of at most tile_tokens (with hot_tokens, an
// expert with more rows than that into items of at most hot_tokens, in the second list), and
// records for every (token, slot) its permuted row. Within an expert the row order is
// whatever the atomics give; every row is computed independently, so the results do not
// depend on it.
__global__ void __launch_bounds__(kPermuteThreads) permute_kernel(PermuteParams p) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ int cnt[kMaxExperts + 1], off[kMaxExperts + 1], item_off[kMaxExperts + 1], hot_off[kMaxExperts + 1];
  const int n_stored = p.n_experts + (p.shared ? 1 : 0);
  const int kk = p.top_k + (p.shared ? 1 : 0);
  const int n_rows = p.n_tokens * kk;
  for (int e = threadIdx.x; e < n_stored; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n_rows; i += blockDim.x) {
    const int t = i / kk, j = i - t * kk;
    const int e = moe_stored_expert(p.ids, t, j, p.top_k, p.first_expert, p.n_experts);
    p.s.pos[i] = e >= 0 ? atomicAdd(&cnt[e], 1) : -1;
  }
  __syncthreads();
  const int tile = p.tile_tokens, hot = p.hot_tokens;
  const auto is_hot = [tile, hot](int c) { return hot > 0 && c > tile; };
  if (threadIdx.x < 32) {
    const int n_items = warp_scan_expert_items(
        cnt, n_stored, [&](int c) { return is_hot(c) ? 0 : (c + tile - 1) / tile; }, off, item_off);
    if (threadIdx.x == 0) *p.s.n_items = n_items;
    if (hot > 0) {  // the same row offsets again, and the hot items'
      const int n_hot = warp_scan_expert_items(
          cnt, n_stored, [&](int c) { return is_hot(c) ? (c + hot - 1) / hot : 0; }, off, hot_off);
      if (threadIdx.x == 0) *p.s.n_hot_items = n_hot;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_stored; e += blockDim.x) {
    const int n = cnt[e];
    const int w = is_hot(n) ? hot : tile;
    MoeWorkItem* items = is_hot(n) ? p.s.hot_items + hot_off[e] : p.s.items + item_off[e];
    for (int q = 0; q * w < n; ++q) items[q] = MoeWorkItem{e, off[e] + q * w, min(w, n - q * w), 0};
  }
  for (int i = threadIdx.x; i < n_rows; i += blockDim.x) {
    const int t = i / kk, j = i - t * kk;
    const int e = moe_stored_expert(p.ids, t, j, p.top_k, p.first_expert, p.n_experts);
    if (e < 0) continue;
    const int row = off[e] + p.s.pos[i];
    p.s.pos[i] = row;
    p.s.row_token[row] = t;
  }
}

// out[t] = sum_j weights[t, j] * y[pos[t, j]] (+ y of the shared expert's row), in a fixed
// slot order so the result is deterministic; slots of other ranks' experts (pos -1) add
// nothing, and a token with none of this rank's gets zeros.
__global__ void combine_kernel(const float* __restrict__ y, const int* __restrict__ pos,
                               const float* __restrict__ weights, int top_k, bool shared,
                               int hidden, __nv_bfloat16* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int kk = top_k + (shared ? 1 : 0);
  // blockIdx.y splits the row: one block per token alone would leave a 1-token batch to a
  // single SM reading 9 rows of y one after another.
  const int span = ((hidden + gridDim.y - 1) / gridDim.y + 3) & ~3;  // float4-aligned
  const int h_end = min(hidden, int(blockIdx.y + 1) * span);
  for (int h = blockIdx.y * span + 4 * threadIdx.x; h < h_end; h += 4 * blockDim.x) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < kk; ++j) {
      const int row = pos[int64_t(t) * kk + j];
      if (row < 0) continue;
      const float w = j < top_k ? weights[int64_t(t) * top_k + j] : 1.0f;
      const float4 v = *reinterpret_cast<const float4*>(y + int64_t(row) * hidden + h);
      acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + int64_t(t) * hidden + h);
    o[0] = __floats2bfloat162_rn(acc.x, acc.y);
    o[1] = __floats2bfloat162_rn(acc.z, acc.w);
  }
}

}  // namespace

void launch_route(const KernelLaunch& launch, const float* logits, int n_tokens, int n_experts,
                  const RoutingSpec& spec, const float* bias, int* ids, float* weights) {
  TETRA_CHECK(n_experts > 0 && n_experts <= kMaxExperts, "moe route: at most ", kMaxExperts,
              " experts are supported, not ", n_experts);
  TETRA_CHECK(spec.top_k > 0 && spec.top_k <= kMaxTopK && spec.top_k <= n_experts,
              "moe route: top_k must be in 1..min(32, E), not ", spec.top_k);
  const bool sigmoid = spec.scoring == Scoring::Sigmoid;
  if (sigmoid && spec.n_group > 1)
    TETRA_CHECK(spec.n_group <= 32 && n_experts % spec.n_group == 0 &&
                    spec.topk_group >= 1 && spec.topk_group <= spec.n_group,
                "moe route: n_group must divide E (at most 32 groups) and 1 <= topk_group <= n_group");
  if (n_tokens == 0) return;
  RouteParams p{logits, bias, ids, weights, n_tokens, n_experts, spec.top_k,
                spec.n_group, spec.topk_group, sigmoid, spec.norm_topk_prob,
                spec.routed_scaling_factor};
  const size_t smem = size_t(kRouteWarps) * 2 * n_experts * sizeof(float);
  launch_kernel(launch, route_kernel, (n_tokens + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, smem, p);
}

void launch_permute(const KernelLaunch& launch, const int* ids, int n_tokens, int top_k, int first_expert,
                    int n_experts, bool shared, int tile_tokens, int hot_tokens, const MoeScratch& s) {
  TETRA_CHECK(n_experts + 1 <= kMaxExperts, "moe: at most ", kMaxExperts - 1, " experts");
  TETRA_CHECK(hot_tokens == 0 || (hot_tokens > tile_tokens && hot_tokens >= kMinHotTokens && s.hot_items &&
                                   s.n_hot_items),
              "moe: hot items are wider than the others, at least ", kMinHotTokens,
              " tokens (their list is sized so), and need their own list");
  PermuteParams p{ids, n_tokens, top_k, first_expert, n_experts, shared, tile_tokens, hot_tokens, s};
  launch_kernel(launch, permute_kernel, 1, kPermuteThreads, 0, p);
}

void launch_combine(const KernelLaunch& launch, const float* y, const int* pos, const float* weights,
                    int n_tokens, int top_k, bool shared, int hidden, uint16_t* out) {
  TETRA_CHECK(hidden % 4 == 0, "moe combine: hidden size must be a multiple of 4");
  // Enough blocks to fill the GPU at small T; spans stay multiples of 4 values.
  const int split = n_tokens >= 256 ? 1 : std::min(hidden / 256, (1024 + n_tokens - 1) / n_tokens);
  launch_kernel(launch, combine_kernel, dim3(n_tokens, std::max(split, 1)), 256, 0, y, pos, weights, top_k, shared,
                hidden, reinterpret_cast<__nv_bfloat16*>(out));
}

}  // namespace tetra::ops::cuda
