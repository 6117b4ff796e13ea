// One token's routing by one warp (FORMATS.md §2.2): scores (softmax, or sigmoid with the
// correction bias for selection only), optional group pruning, top-k, optional
// renormalization, scaling. The route kernel (sm90_moe_route.cu) and the fused decode kernel
// (sm90_moe_decode.cu) both call it, so a step routes alike whichever of them runs.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/moe_internal.h"

namespace tetra::ops::cuda::moe_route {

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

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;  // ties go to the lower index
  }
}

// A float onto unsigned ints in the same order (with -0 as +0, which compare equal); 0, below
// every number, is left for "no candidate".
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Routes token t: ids[j] and weights[j] for j < top_k (any memory space, written by this warp
// alone). score and sel: this warp's 2 E floats of shared memory.
__device__ __forceinline__ void route_token(const RouteArgs& p, int t, float* score, float* sel, int* ids,
                                            float* weights) {
  const int lane = int(threadIdx.x) & 31;
  const int E = p.n_experts;
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

  // Top-k. Each lane keeps the best of its experts e = lane + 32 i (the lowest e among equal
  // scores); a round takes the warp's best in two reductions (largest key, then lowest expert
  // holding it), and only the lane that owned the winner looks again. -inf and NaN are never
  // candidates, as with a scan by `>`.
  float best = -INFINITY;
  int best_e = INT_MAX;
  const auto rescan = [&] {
    best = -INFINITY, best_e = INT_MAX;
    for (int e = lane; e < E; e += 32)
      if (sel[e] > best) best = sel[e], best_e = e;
  };
  rescan();
  float my_weight = 0.0f;  // lane j keeps the weight of the j-th choice
  for (int j = 0; j < p.top_k; ++j) {
    const uint32_t key = best_e == INT_MAX ? 0u : order_key(best);
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    int i = __reduce_min_sync(0xffffffffu, key == top ? best_e : INT_MAX);
    if (i >= E) i = 0;  // only with NaN scores: keep the index in range
    if (lane == j) my_weight = score[i];
    if (lane == 0) ids[j] = i;
    if (lane == (i & 31)) {
      sel[i] = -INFINITY;
      rescan();
    }
  }
  if (p.norm) {
    const float sum = warp_sum(lane < p.top_k ? my_weight : 0.0f);
    my_weight = p.sigmoid ? my_weight / (sum + 1e-20f) : my_weight / sum;
  }
  if (lane < p.top_k) weights[lane] = my_weight * p.scaling;
}

}  // namespace tetra::ops::cuda::moe_route
