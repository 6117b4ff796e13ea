// Multi-head latent attention (DeepSeek-V3, Kimi K2, GLM-4.7-Flash, GLM-5) in its absorbed
// form over the latent paged cache, and the DSA indexer's choice of keys (GLM-5), on sm_90a.
//
// Cache rows are [latent (rank) | rope key (d_rope)], one per token, BF16 or (--kv-cache-dtype
// fp8_e4m3) E4M3 at scale 1: every head of a token reads the same row, as its key (all rank +
// d_rope values) and its value (the latent). The kernels widen E4M3 to BF16 exactly, so an FP8
// cache gives what a BF16 cache holding the same values gives.
// For token t and head h over the keys j it sees,
//   score_j = scale * (q_latent[t,h] . c_j + q_rope[t,h] . r_j),  out[t,h] = sum_j softmax_j c_j,
// with f32 scores and softmax and the output rounded to BF16 once (Backend::mla_attention).
#pragma once

#include <cstdint>

#include "ops/cuda/launch.h"

namespace tetra::ops::cuda {

struct MlaAttentionParams {
  const uint16_t* q_latent;     // bf16 [n_tokens, n_heads, rank]
  const uint16_t* q_rope;       // bf16 [n_tokens, n_heads, d_rope]
  const void* cache;            // bf16, or e4m3 if fp8_cache: [n_blocks, block_size, rank + d_rope]
  const int32_t* selected;      // [n_tokens, top_k] positions (-1: unused), or null: every key up to
                                // the token's position
  uint16_t* out;                // bf16 [n_tokens, n_heads, rank]
  const int32_t* positions;     // [n_tokens]
  const int32_t* seq_starts;    // [n_seqs + 1]
  const int32_t* block_tables;  // [n_seqs, max_blocks_per_seq]
  int n_tokens, n_seqs, n_heads, rank, d_rope, top_k, block_size, max_blocks_per_seq;
  int max_query_len;            // host: the most tokens any one sequence has in this batch
  float scale;
  bool fp8_cache;
};

enum class MlaAttentionPath : uint8_t {
  Wgmma,     // wgmma: 64 (token, head) rows a block against 64-key tiles; rank 512, rope 64, groups of 64+ rows
  Tiled,     // mma.sync: 32 rows a block against 64-key tiles; rank 512, rope 64, smaller groups
  Fallback,  // one warp per (token, head), f32 CUDA cores: any rank and rope width
};

struct MlaAttentionPlan {
  MlaAttentionPath path = MlaAttentionPath::Fallback;
  int n_row_tiles = 0;  // tiled: blocks along a group's rows (a sequence's, or one token's with `selected`)
  int n_splits = 1;     // key ranges computed apart, then merged
  // wgmma: a row tile's splits run as one thread-block cluster and merge their results in
  // distributed shared memory, with no partial results in memory and no second kernel.
  bool cluster_merge = false;
};

MlaAttentionPlan mla_attention_plan(const MlaAttentionParams& p, int sm_count);
int64_t mla_attention_workspace_bytes(const MlaAttentionParams& p, int sm_count);

// Enqueues the attention as `launch` says (its stream; PDL or not): no synchronization, no allocation,
// graph-capturable.
void mla_attention(const KernelLaunch& launch, const MlaAttentionParams& p, void* workspace, int64_t workspace_bytes,
                   int sm_count);

struct DsaSelectParams {
  const uint16_t* q;            // bf16 [n_tokens, n_heads, dim]
  const float* weights;         // f32 [n_tokens, n_heads]
  const void* index_k;          // bf16, or e4m3 if fp8_keys: [n_blocks, block_size, dim]
  int32_t* selected;            // [n_tokens, top_k]
  const int32_t* positions;     // [n_tokens]
  const int32_t* seq_starts;    // [n_seqs + 1]
  const int32_t* block_tables;  // [n_seqs, max_blocks_per_seq]
  int n_tokens, n_seqs, n_heads, dim, top_k, block_size, max_blocks_per_seq;
  // The most keys a token of this step has (AttentionBatch::max_seq_len); 0: the block
  // tables' whole row. The scores' grid and workspace are sized by it, so a launch given it
  // serves no longer sequence (a captured graph must not be given it).
  int max_seq_len;
  float q_scale, weight_scale;
  bool fp8_keys;                // index keys in E4M3 at scale 1 (--kv-cache-dtype fp8_e4m3)
};

// For each token, score_j = sum_h weights[t,h] * weight_scale * relu(q_scale * q[t,h] . k_j)
// over its sequence's keys 0 .. position, and the top_k best positions (ties to the lower
// position, as the CPU reference breaks them), in ascending position order, then -1s.
// Scores go through the workspace a group of tokens at a time.
int64_t dsa_select_workspace_bytes(const DsaSelectParams& p);
void dsa_select(const KernelLaunch& launch, const DsaSelectParams& p, void* workspace, int64_t workspace_bytes);

}  // namespace tetra::ops::cuda
