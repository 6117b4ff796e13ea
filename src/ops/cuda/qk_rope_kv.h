// The attention inputs' last step in one launch (Backend::qk_norm_rope_kv_write): per head of
// q and k, the optional RMSNorm (qk-norm families), then rope; then k and v into the paged
// cache at the batch's slots. The same arithmetic, in the same order, as norm.cu's rms_norm,
// rope.cu's rope and kv_write.cu's cache_write run one after another.
#pragma once

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

// q [T, H, D], k [T, KV, D], v [T, KV, Dv], rewritten in place (q and k); q_norm and k_norm
// [D] or both empty; slots [T] (negative: write nothing).
void qk_norm_rope_kv_write(const KernelLaunch& launch, TensorView q, TensorView k, TensorView v, TensorView q_norm,
                           TensorView k_norm, float eps, TensorView positions, const RopeSpec& rope, TensorView slots,
                           TensorView k_cache, TensorView v_cache);

}  // namespace tetra::ops::cuda
