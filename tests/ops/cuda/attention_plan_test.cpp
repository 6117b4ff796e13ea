// Which kernel paged_attention runs, and how it splits the keys (ops/cuda/attention_gqa.h):
// the plan is host code, checked on the CPU. The kernels' results are gpu_tests' (the
// attention cases check each path's plan and its output against a double reference).
#include <gtest/gtest.h>

#include <cstdint>

#include "ops/cuda/attention_gqa.h"
#include "ops/cuda/attention_gqa_internal.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kSms = 132;  // an H200's

// One step's shape; the plan never reads memory, so the tensors are addresses only (16-byte
// aligned unless asked otherwise).
PagedAttentionParams step(int n_heads, int n_kv_heads, int d_k, int d_v, int n_tokens, int max_seq_len) {
  PagedAttentionParams p{};
  const auto at = [](uintptr_t a) { return reinterpret_cast<const void*>(a); };
  p.q = static_cast<const uint16_t*>(at(0x10000));
  p.k_cache = at(0x20000);
  p.v_cache = at(0x30000);
  p.out = static_cast<uint16_t*>(const_cast<void*>(at(0x40000)));
  p.positions = p.seq_starts = p.seq_lens = p.block_tables = static_cast<const int32_t*>(at(0x50000));
  p.n_tokens = n_tokens;
  p.n_seqs = 1;
  p.n_heads = n_heads;
  p.n_kv_heads = n_kv_heads;
  p.d_k = d_k;
  p.d_v = d_v;
  p.block_size = 16;
  p.max_blocks_per_seq = (max_seq_len + 15) / 16;
  p.max_query_len = n_tokens;
  p.max_seq_len = max_seq_len;
  p.scale = 0.088f;
  return p;
}

TEST(PagedAttentionPlan, Bf16PromptsOfHeadDim128RunOnWgmma) {
  // Qwen3-30B-A3B's 8,192-token prompt: 65,536 packed rows of 32 heads over 4 KV heads.
  const PagedAttentionPlan plan = paged_attention_plan(step(32, 4, 128, 128, 8192, 8192), kSms);
  EXPECT_EQ(plan.path, PagedAttentionPath::PrefillWgmma);
  EXPECT_EQ(plan.head_dim_tile, 128);
  EXPECT_EQ(plan.n_row_tiles, 8192 * 8 / gqa::kWgmmaRows);
  EXPECT_EQ(plan.n_splits, 1) << "2,048 blocks fill the GPU without splitting the keys";
  // Groups of 1 and 16, and a prompt whose rows end inside a row tile.
  EXPECT_EQ(paged_attention_plan(step(8, 8, 128, 128, 300, 300), kSms).path, PagedAttentionPath::PrefillWgmma);
  EXPECT_EQ(paged_attention_plan(step(32, 2, 128, 128, 77, 200), kSms).path, PagedAttentionPath::PrefillWgmma);
}

TEST(PagedAttentionPlan, OtherPromptsKeepTheMmaSyncKernel) {
  PagedAttentionParams fp8 = step(32, 4, 128, 128, 8192, 8192);
  fp8.fp8_cache = true;
  fp8.k_scale = 0.5f;
  fp8.v_scale = 2.0f;
  EXPECT_EQ(paged_attention_plan(fp8, kSms).path, PagedAttentionPath::Prefill) << "an FP8 cache";
  EXPECT_EQ(paged_attention_plan(step(16, 4, 64, 64, 300, 300), kSms).path, PagedAttentionPath::Prefill);
  EXPECT_EQ(paged_attention_plan(step(8, 1, 256, 256, 300, 300), kSms).path, PagedAttentionPath::Prefill);
  // d 128 zero-padded from fewer dims, or K and V of different widths.
  EXPECT_EQ(paged_attention_plan(step(16, 4, 120, 120, 300, 300), kSms).path, PagedAttentionPath::Prefill);
  EXPECT_EQ(paged_attention_plan(step(16, 4, 192, 128, 300, 300), kSms).path, PagedAttentionPath::Prefill);
}

TEST(PagedAttentionPlan, DecodeAndMisalignedTensorsTakeTheirOwnPaths) {
  // One token of a group of 8: 8 rows fit the decode tile of 16.
  EXPECT_EQ(paged_attention_plan(step(32, 4, 128, 128, 1, 4096), kSms).path, PagedAttentionPath::Decode);
  PagedAttentionParams misaligned = step(32, 4, 128, 128, 8192, 8192);
  misaligned.q += 1;
  EXPECT_EQ(paged_attention_plan(misaligned, kSms).path, PagedAttentionPath::Fallback);
}

TEST(PagedAttentionPlan, FewRowTilesSplitLongContextsInWholeKeyTiles) {
  // 64 new tokens after 5,936 cached: 512 rows, 4 row tiles x 4 KV heads = 16 blocks, far from
  // filling 132 SMs, so the 6,000 keys are split, every split but the last a whole number of
  // the kernel's key tiles and at least 512 keys.
  PagedAttentionParams p = step(32, 4, 128, 128, 64, 6000);
  const PagedAttentionPlan plan = paged_attention_plan(p, kSms);
  ASSERT_EQ(plan.path, PagedAttentionPath::PrefillWgmma);
  EXPECT_EQ(plan.n_row_tiles, 4);
  EXPECT_GE(plan.n_splits, 2);
  EXPECT_EQ(plan.keys_per_split % gqa::kWgmmaKeys, 0);
  EXPECT_GE(plan.keys_per_split, 512);
  EXPECT_GE(int64_t(plan.keys_per_split) * plan.n_splits, 6000) << "the splits cover every key";
  EXPECT_LT(int64_t(plan.keys_per_split) * (plan.n_splits - 1), 6000) << "no split is empty";
  EXPECT_GT(paged_attention_workspace_bytes(p, kSms), 0) << "the splits' partial results need scratch";
}

}  // namespace
}  // namespace tetra::ops::cuda
