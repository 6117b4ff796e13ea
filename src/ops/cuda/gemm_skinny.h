// Dense BF16 linears of 9 to 64 tokens (decode batches): out [T, n_out] = x [T, n_in] W^T
// (+ bias) on mma.sync, the weights streamed once by the warps of the MoE tiles
// (sm90_moe_stream.cuh), the tokens as the MMA's N. At these sizes cuBLASLt's kernels read the
// weights at a fraction of the bandwidth (docs/PERF.md); up to 8 tokens gemv.h's kernel runs.
#pragma once

#include <span>

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

constexpr int64_t kSkinnyMinTokens = 9, kSkinnyMaxTokens = 64;

// Runs the linears of x (up to 4 parts of one input width, one output dtype) and returns true
// when every part qualifies: a dense BF16 weight of n_out a multiple of 16 and n_in a multiple
// of 128, BF16 x of 9..64 rows, BF16 or F32 out, 16-byte aligned. False runs nothing.
bool gemm_skinny_bf16(const KernelLaunch& launch, TensorView x, std::span<const LinearPart> parts);

}  // namespace tetra::ops::cuda
