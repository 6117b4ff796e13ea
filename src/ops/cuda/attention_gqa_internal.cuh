// What the GQA attention kernels share (attention_gqa.cu's mma.sync and fallback kernels,
// attention_gqa_wgmma.cu's prefill kernel): the launch arguments, a key's cache slot, and the
// wgmma prefill kernel's tile and launch.
#pragma once

#include <cstdint>

#include "core/fast_divide.h"
#include "ops/cuda/attention_gqa.h"
#include "ops/cuda/launch.h"

namespace tetra::ops::cuda::gqa {

// Everything a kernel reads: the caller's parameters and the host's plan.
struct KernelArgs {
  PagedAttentionParams p;
  int group;             // query heads per KV head
  int n_splits;          // key ranges per work item (1: the kernel writes `out` itself)
  int keys_per_split;    // a multiple of the key tile; the last split runs to the end
  int key_cap;           // max_blocks_per_seq * block_size: no key past the block table row
  float scale_log2;      // scale * log2(e) (* k_scale for an FP8 cache): the softmax runs on exp2
  float v_scale;         // an FP8 cache's v_scale (1 for BF16): the output's factor
  FastDivisor block;     // p.block_size: a key's block-table entry and offset without a division
  float* partial_acc;    // [n_tokens, n_heads, n_splits, d_v]: unnormalized sums of p * v
  float2* partial_ml;    // [n_tokens, n_heads, n_splits]: max (log2 units), sum of p
};

#if defined(__CUDACC__)
__device__ __forceinline__ int slot_of(const KernelArgs& a, int seq, int key) {
  const uint32_t index = a.block.quotient(uint32_t(key));
  const int block = a.p.block_tables[int64_t(seq) * a.p.max_blocks_per_seq + index];
  return block * a.p.block_size + int(a.block.remainder(uint32_t(key), index));
}
#endif

// The wgmma prefill kernel (PagedAttentionPath::PrefillWgmma): BF16 cache, d_k = d_v = 128;
// a block is 128 query rows against 64-key tiles, two blocks an SM.
constexpr int kWgmmaHeadDim = 128, kWgmmaRows = 128, kWgmmaKeys = 64, kWgmmaBlocksPerSm = 2;

// grid: (row tiles x KV heads x splits, sequences), the longest row tiles first.
void launch_prefill_wgmma(const KernelLaunch& launch, const KernelArgs& a, const PagedAttentionPlan& plan);

}  // namespace tetra::ops::cuda::gqa
