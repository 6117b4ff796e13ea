// Dense BF16 linears of few tokens (decode): out [T, n_out] = x [T, n_in] W^T (+ bias), T <= 8,
// as a weight-streaming kernel. At these sizes cuBLASLt's kernels reach a fraction of the
// bandwidth (a 2 MB projection took about 14 us on the H200 where its bytes take 0.5). Each
// output is one f32 dot product in a fixed order that does not depend on T, so a token's
// result is the same in any batch of up to 8.
#pragma once

#include <span>

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

constexpr int64_t kGemvMaxTokens = 8;

// Runs the linear and returns true when it qualifies (dense BF16 weight and x, BF16 or F32
// out, 1..8 tokens, n_in a multiple of 8, 16-byte aligned rows); false leaves it to the caller.
bool gemv_bf16(const KernelLaunch& launch, TensorView x, const LinearWeight& w, TensorView out);
// Several linears of x in one launch (up to 4, one width of input, one output dtype), each as
// the single form computes it; false when any part does not qualify (nothing is run then).
bool gemv_bf16(const KernelLaunch& launch, TensorView x, std::span<const LinearPart> parts);
// A router: logits [T, E] F32 as gemv_bf16 computes them, then ids and weights [T, top_k] as the
// route kernel computes them from those logits (the same bits), routed by the launch's last
// block. `counter` is a device int that is 0 between launches on its stream (the last block
// sets it back). False where it does not qualify (as gemv_bf16, and 2 * E floats a token fit
// 48 KB of shared memory); nothing is run then.
bool gemv_bf16_route(const KernelLaunch& launch, TensorView x, const LinearWeight& w, TensorView logits,
                     const RoutingSpec& spec, const float* bias, int* ids, float* weights, int* counter);

}  // namespace tetra::ops::cuda
