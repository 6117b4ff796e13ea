// Dense BF16 linears of 2-64 tokens (decode batches): out [T, n_out] = x [T, n_in] W^T (+ bias)
// on wgmma, streaming W once. Where it runs instead of the GEMV or cuBLASLt is linear_path.h's
// rule; at Qwen3-30B-A3B's q/k/v it streams 2.2x faster than cuBLASLt's three launches.
//
// A block is one warpgroup and 64 rows of W (wgmma's M); x's tokens are its N (16, 32 or 64,
// the rows past T zero), so a stage is W's 8 KB and x's 2-8 KB, and a block keeps 3-6 of W's
// chunks in flight, three blocks an SM. A cluster of `skinny_split(n_in)` blocks shares a
// tile's K, and its first block adds the others' sums from their shared memory in rank order.
// The split depends on n_in alone, so a token's output is the same bits in any batch the
// kernel runs and whether its linear runs alone or beside others in one launch (wgmma gives a
// row the same bits at N 16, 32 and 64; gpu_tests checks it).
#pragma once

#include <span>

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

constexpr int64_t kSkinnyMaxTokens = 64;

// Blocks that share one 64-row tile's K for an input width of n_in (1..6).
int skinny_split(int64_t n_in);

// Runs the linears of x (up to 4, one input width, one output dtype) in one launch and returns
// true when every part qualifies (dense BF16 weight and x, BF16 or F32 out, 1..64 tokens, n_in
// a multiple of 64, 16-byte aligned); false runs nothing and leaves them to the caller.
bool gemm_skinny_bf16(const KernelLaunch& launch, TensorView x, std::span<const LinearPart> parts);

}  // namespace tetra::ops::cuda
