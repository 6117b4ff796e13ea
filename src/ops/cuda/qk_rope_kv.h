// The attention inputs' last step in one launch (Backend::qk_norm_rope_kv_write): per head of
// q and k, the optional RMSNorm (qk-norm families), then rope; then k and v into the paged
// cache at the batch's slots. The same arithmetic, in the same order, as norm.cu's rms_norm,
// rope.cu's rope and kv_write.cu's cache_write run one after another.
#pragma once

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

// q [T, H, D], k [T, KV, D], v [T, KV, Dv], rewritten in place (q and k); q_norm and k_norm
// [D] or both empty; slots [T] (negative: write nothing). An FP8 cache stores k / k_scale and
// v / v_scale.
void qk_norm_rope_kv_write(const KernelLaunch& launch, TensorView q, TensorView k, TensorView v, TensorView q_norm,
                           TensorView k_norm, float eps, TensorView positions, const RopeSpec& rope, TensorView slots,
                           TensorView k_cache, TensorView v_cache, float k_scale, float v_scale);

// Backend::mla_rope_cache_write: q [T, H, dn + dr] into q_nope [T, H, dn] and the rotated
// q_rope [T, H, dr]; ckv [T, rank + dr] normalized (latent, weight kv_norm [rank]) and rotated
// (its last dr) in place, then copied to `cache` at `slots` (negative: write nothing). One
// warp per (token, head) and one per token's cache entry; each value is rounded where the
// separate ops round it.
void mla_rope_cache_write(const KernelLaunch& launch, TensorView q, TensorView q_nope, TensorView q_rope,
                          TensorView ckv, TensorView kv_norm, float eps, TensorView positions, const RopeSpec& rope,
                          TensorView slots, TensorView cache);

}  // namespace tetra::ops::cuda
