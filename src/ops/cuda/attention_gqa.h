// Paged causal attention for grouped-query attention over a paged BF16 or FP8 (E4M3) KV
// cache (sm_90a).
//
// Token t of sequence s, head h, attends to the cached positions 0 .. positions[t] of s in
// KV head h / (n_heads / n_kv_heads); position j lives at slot
// block_tables[s * max_blocks_per_seq + j / block_size] * block_size + j % block_size.
// Scores and the softmax are f32; the output is rounded to BF16 once. An FP8 cache holds
// k / k_scale and v / v_scale (ops::KvCacheLayer): the kernels widen it to BF16 in shared
// memory (exact) and fold k_scale into the softmax scale, v_scale into the output.
#pragma once

#include <cstdint>

#include "ops/cuda/launch.h"

namespace tetra::ops::cuda {

struct PagedAttentionParams {
  const uint16_t* q;            // bf16 [n_tokens, n_heads, d_k], contiguous
  const void* k_cache;          // bf16 or e4m3 [n_blocks, block_size, n_kv_heads, d_k]
  const void* v_cache;          // the same, [n_blocks, block_size, n_kv_heads, d_v]
  uint16_t* out;                // bf16 [n_tokens, n_heads, d_v]
  const int32_t* positions;     // [n_tokens]: position of each token in its sequence
  const int32_t* seq_starts;    // [n_seqs + 1]: tokens [seq_starts[s], seq_starts[s+1]) belong to sequence s
  const int32_t* seq_lens;      // [n_seqs]: tokens of sequence s in the cache (>= every position + 1 of its tokens)
  const int32_t* block_tables;  // [n_seqs, max_blocks_per_seq]: KV block ids of each sequence
  int n_tokens, n_seqs, n_heads, n_kv_heads, d_k, d_v, block_size, max_blocks_per_seq;
  int max_query_len;            // host: the most tokens any one sequence has in this batch
  int max_seq_len;              // host: the largest seq_lens entry (prefill plans its splits by it;
                                // decode by max_blocks_per_seq, the same for every step)
  float scale;                  // softmax scale (1/sqrt(d_k) usually)
  bool fp8_cache = false;       // the cache is E4M3 bytes
  float k_scale = 1.0f, v_scale = 1.0f;  // an FP8 cache's per-tensor scales (1 for BF16)
};

// Device scratch paged_attention needs (split-KV partial results); may be 0.
int64_t paged_attention_workspace_bytes(const PagedAttentionParams& p, int sm_count);

// Enqueues the attention as `launch` says (its stream; PDL or not); no host synchronization, no allocation,
// graph-capturable. Throws tetra::Error (core/error.h, via TETRA_CHECK) on unsupported arguments.
void paged_attention(const KernelLaunch& launch, const PagedAttentionParams& p, void* workspace,
                     int64_t workspace_bytes, int sm_count);

// How paged_attention will run a batch: for tests and logs (the choice is made on the host
// from the shapes and max_query_len / max_seq_len alone).
enum class PagedAttentionPath : uint8_t {
  Decode,    // mma.sync; a sequence's query rows (tokens x group) fit one 16-row tile, whose
             // warps split each key tile; keys split over blocks to fill the GPU
  Prefill,   // mma.sync; 8 warps a block: 128 query rows (64 at d 256) share each K/V tile
  PrefillWgmma,  // wgmma (BF16 cache, d_k = d_v = 128): two warpgroups' 128 query rows
                 // share each 64-key K/V tile, Q K^T and P V read from shared memory
  Fallback,  // one warp per (token, head), f32 CUDA cores: head dims not a multiple of 8,
             // or tensors not 16-byte aligned
};

struct PagedAttentionPlan {
  PagedAttentionPath path = PagedAttentionPath::Fallback;
  int head_dim_tile = 0;   // mma paths: d_k and d_v zero-padded to this (64, 128 or 256)
  int n_row_tiles = 0;     // mma paths: blocks per (sequence, KV head) along the query rows
  int n_splits = 1;        // key ranges computed apart and combined by a second kernel
  int keys_per_split = 0;  // prefill: every split but the last covers this many keys; decode: the
                           // most a split covers (each sequence divides its own keys evenly)
};

PagedAttentionPlan paged_attention_plan(const PagedAttentionParams& p, int sm_count);

}  // namespace tetra::ops::cuda
