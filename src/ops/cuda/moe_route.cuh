// Routing one token (router logits -> top-k experts and weights, FORMATS.md §2.2) with one
// warp: the body of the route kernel, and of the router GEMV's last block where the GEMV
// routes its own logits (gemv.cu). Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/ops.h"

namespace tetra::ops::cuda {

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

// The parameters of routing n_tokens tokens, checked: one sentence for a spec the kernels do
// not take (more than 1024 experts, top_k outside 1..32, groups that do not divide E).
RouteParams route_params(const float* logits, int n_tokens, int n_experts, const RoutingSpec& spec, const float* bias,
                         int* ids, float* weights);

// Shared memory the routing of one token takes (a warp's).
inline size_t route_smem_bytes(int n_experts) { return size_t(2) * size_t(n_experts) * sizeof(float); }

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

// One warp routes token t: scores (softmax, or sigmoid with the correction bias for selection
// only), optional group pruning, top-k, optional renormalization, scaling. `smem` holds 2 * E
// floats for this warp. Logits are read through L2 (__ldcg): where the router GEMV routes in
// its last block, other blocks of the same launch wrote them.
__device__ __forceinline__ void route_token(const RouteParams& p, int t, float* smem) {
  const int lane = threadIdx.x & 31;
  const int E = p.n_experts;
  float* score = smem;     // the weights come from these
  float* sel = score + E;  // and the choice from these
  const float* l = p.logits + int64_t(t) * E;

  if (!p.sigmoid) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, __ldcg(l + e));
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float x = expf(__ldcg(l + e) - m);
      score[e] = x;
      sum += x;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int e = lane; e < E; e += 32) score[e] *= inv, sel[e] = score[e];
  } else {
    for (int e = lane; e < E; e += 32) {
      const float s = 1.0f / (1.0f + expf(-__ldcg(l + e)));
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


}  // namespace tetra::ops::cuda
