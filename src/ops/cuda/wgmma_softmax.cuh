// The online softmax of a warpgroup's score tile in wgmma's accumulator layout, shared by the
// attention kernels on wgmma (attention_mla_wgmma.cu, attention_gqa_wgmma.cu).
//
// Accumulator i of a lane holds row (i / 2) & 1 of its two (g and g + 8 of its warp's 16). A
// row's reference maximum moves only when a tile beats it by more than kRescaleSlack (log2
// units, a factor 256), so the output's rescale is skipped in most tiles; the weights stay at
// most 2^8, exact in f32 and as BF16 as any others.
#pragma once

#include <cmath>

#include "ops/cuda/mma_sync.cuh"

namespace tetra::ops::cuda::wgmma {

constexpr float kRescaleSlack = 8.0f;

// s: the lane's scores in log2 units (-inf where masked); tile_max: each row's largest of
// them. Turns s into p = exp2(s - reference) in place, moves the references m (-inf before a
// row's first key), adds the tile to the lane's sums l, and returns each row's factor for the
// output (1 unless its reference moved; 0 at its first key, where the output is still 0).
template <int kN>
__device__ __forceinline__ float2 softmax_tile(float (&s)[kN], const float (&tile_max)[2], float (&m)[2], float (&l)[2]) {
  float alpha[2], base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_tile = quad_max(tile_max[r]);
    alpha[r] = 1.0f;
    if (m_tile > m[r] + kRescaleSlack) {  // a row's first key too: m = -inf, alpha = 0
      alpha[r] = exp2_approx(m[r] - m_tile);
      m[r] = m_tile;
    }
    base[r] = m[r] == -INFINITY ? 0.0f : m[r];  // no key yet: exp2(-inf - 0) = 0, not NaN
  }
  float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int r = (i / 2) & 1;
    s[i] = exp2_approx(s[i] - base[r]);
    tile_sum[r] += s[i];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + tile_sum[r];
  return make_float2(alpha[0], alpha[1]);
}

}  // namespace tetra::ops::cuda::wgmma
