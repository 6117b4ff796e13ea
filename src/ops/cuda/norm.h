// RMSNorm and LayerNorm over the last dimension on CUDA, f32 inside whatever is stored.
#pragma once

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

// out = weight * x / sqrt(mean(x^2) + eps); out may alias x.
void rms_norm(const KernelLaunch& launch, TensorView x, TensorView weight, float eps, TensorView out);
// h += delta (rounded to h's dtype), then out = rms_norm(h): one read of each, one write of
// each; out must not alias h or delta.
void add_rms_norm(const KernelLaunch& launch, TensorView h, TensorView delta, TensorView weight, float eps,
                  TensorView out);
// out = (x - mean) / sqrt(var + eps) * weight (+ bias); out may alias x.
void layer_norm(const KernelLaunch& launch, TensorView x, TensorView weight, TensorView bias, float eps,
                TensorView out);

}  // namespace tetra::ops::cuda
