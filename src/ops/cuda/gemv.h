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

}  // namespace tetra::ops::cuda
