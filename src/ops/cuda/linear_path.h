// Which kernel runs a launch of dense BF16 linears of x (one linear, or q/k/v sharing x): the
// GEMV (gemv.h), the wgmma skinny kernel (gemm_skinny.h) or cuBLASLt. Each is fastest somewhere;
// the rule is what `tetra bench linear` measured on the H200 (docs/PERF.md, 2026-12-04), in
// graphs, over the Qwen3-30B-A3B and GLM-5 shapes:
//   - 1 token: the GEMV streams every shape at 63-107% of the read ceiling;
//   - under 512 rows (routers): the GEMV up to 8 tokens, then cuBLASLt: the skinny kernel has
//     too few blocks there;
//   - 48 MiB of weights or more (GLM-5's q_b and o_proj, lm_heads): cuBLASLt, which streams them
//     at 82-96% from 2 tokens where the skinny kernel reaches 60-75%;
//   - otherwise the skinny kernel: up to 16 tokens for one linear (o_proj 1.2x cuBLASLt; at
//     32 cuBLASLt is 10% ahead), up to 64 for several in one launch, which cuBLASLt runs one
//     launch each (q/k/v: 2.3x at 8-16 tokens, 1.5x at 64); cuBLASLt above.
// A path that does not take the launch (another dtype, an odd width) falls through to cuBLASLt.
#pragma once

#include <span>

#include "ops/ops.h"

namespace tetra::ops::cuda {

enum class DenseLinearPath { Gemv, Skinny, Library };

DenseLinearPath dense_linear_path(int64_t tokens, std::span<const LinearPart> parts);

}  // namespace tetra::ops::cuda
