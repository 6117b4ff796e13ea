// Whole models and the serving engine on the CUDA backend (label gpu; skipped without a GPU).
// The rule for comparing a GPU run with a reference: cuda_model_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "cuda_model_util.h"

namespace tetra {
namespace {

using namespace cuda_testing;

class CudaFixture : public Cuda, public ::testing::WithParamInterface<std::string> {};

// Not a check: each op's output of one prefill on both backends, by NMSE (for finding where a
// model's GPU run parts from the CPU's). Run with --gtest_also_run_disabled_tests.
TEST_P(CudaFixture, DISABLED_OpByOpDiff) {
  const auto dir = testing::fixtures_dir() / GetParam();
  RouterGaps cpu(ops::make_cpu_backend(0)), cuda(ops::make_backend({.device = "cuda"}));
  auto cm = model::load_model(dir, cpu);
  auto gm = model::load_model(dir, cuda);
  const auto cases = testing::read_cases(dir);
  const auto& c = cases.back();
  cpu.record = cuda.record = true;
  runtime::generate(*cm, cpu, c.prompt_ids, {.max_new_tokens = 1, .ignore_eos = true});
  runtime::generate(*gm, cuda, c.prompt_ids, {.max_new_tokens = 1, .ignore_eos = true});
  ASSERT_EQ(cpu.outputs.size(), cuda.outputs.size());
  for (size_t i = 0; i < cpu.outputs.size(); ++i) {
    const auto& a = cpu.outputs[i].second;
    const auto& b = cuda.outputs[i].second;
    double e = 0, r = 0, worst = 0;
    for (size_t j = 0; j < a.size() && j < b.size(); ++j) {
      e += (a[j] - b[j]) * double(a[j] - b[j]);
      r += double(a[j]) * a[j];
      worst = std::max(worst, double(std::abs(a[j] - b[j])));
    }
    std::printf("  op %3zu %-12s n=%-6zu NMSE %.2e  max |d| %.3e\n", i, cpu.outputs[i].first.c_str(), a.size(),
                r > 0 ? e / r : e, worst);
  }
}

// Every shipped GQA fixture (BF16 and NVFP4) against transformers' greedy tokens and log-probs.
TEST_P(CudaFixture, GenerateMatchesTransformers) {
  const auto dir = testing::fixtures_dir() / GetParam();
  auto model = model::load_model(dir, *gpu);
  const auto cases = testing::read_cases(dir);
  ASSERT_FALSE(cases.empty());
  const std::vector<size_t> checked = positions_before_router_ties(dir, cases);
  std::vector<runtime::RequestParams> reqs;
  for (const auto& c : cases) reqs.push_back(greedy(c.prompt_ids, c.max_new_tokens));
  const auto runs = run_engine(*model, *gpu, reqs, small_engine());
  for (size_t i = 0; i < cases.size(); ++i)
    expect_close(runs[i], cases[i].token_ids, cases[i].logprobs, {}, GetParam() + " case " + std::to_string(i),
                 checked[i]);
  // And the plain loop (tetra generate's): the log-probs before any divergence.
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto r = runtime::generate(*model, *gpu, cases[i].prompt_ids,
                                     {.max_new_tokens = cases[i].max_new_tokens, .ignore_eos = true});
    size_t same = 0;
    while (same < r.token_ids.size() && r.token_ids[same] == cases[i].token_ids[same]) ++same;
    for (size_t t = 0; t < std::min(same, checked[i]); ++t)
      EXPECT_NEAR(r.logprobs[t], cases[i].logprobs[t], kLogprobTolerance) << GetParam() << " generate case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Gqa, CudaFixture,
                         ::testing::Values("qwen3_moe-tiny", "qwen3_moe-nonorm", "glm4_moe-tiny", "mixtral-tiny",
                                           "qwen3_moe-tiny-nvfp4", "qwen3_moe-nonorm-nvfp4", "glm4_moe-tiny-nvfp4",
                                           "mixtral-tiny-nvfp4"),
                         testing::fixture_test_name);
INSTANTIATE_TEST_SUITE_P(Mla, CudaFixture,
                         ::testing::Values("deepseek_v3-tiny", "deepseek_v3-noqlora", "glm4_moe_lite-tiny",
                                           "glm_moe_dsa-tiny", "deepseek_v3-tiny-nvfp4", "deepseek_v3-noqlora-nvfp4",
                                           "glm4_moe_lite-tiny-nvfp4", "glm_moe_dsa-tiny-nvfp4"),
                         testing::fixture_test_name);

class CudaDummy : public Cuda, public ::testing::WithParamInterface<std::string> {};

// The real families' proportions at small size (dims multiples of 128, so the fast MoE,
// attention and cuBLASLt paths run) with dummy weights, which are the same numbers on both
// backends: CPU reference against GPU, 12 requests batched together.
TEST_P(CudaDummy, BatchedEngineMatchesTheCpuReference) {
  const auto dir = testing::fixtures_dir() / GetParam();
  auto cpu = ops::make_cpu_backend(0);
  auto cpu_model = model::load_model(dir, *cpu, {.dummy = true});
  auto gpu_model = model::load_model(dir, *gpu, {.dummy = true});
  const auto reqs = mixed_requests(12, cpu_model->config().vocab_size, 7);
  const auto want = run_engine(*cpu_model, *cpu, reqs, small_engine());
  const auto got = run_engine(*gpu_model, *gpu, reqs, small_engine());
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<double> lp(want[i].logprobs.begin(), want[i].logprobs.end());
    expect_close(got[i], want[i].tokens, lp, want[i].top, GetParam() + " request " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaDummy,
                         ::testing::Values("qwen3_moe-small-config", "qwen3_moe-small-nvfp4-config",
                                           "glm4_moe-small-config", "mixtral-small-config",
                                           "deepseek_v3-small-config", "glm_moe_dsa-small-config"),
                         testing::fixture_test_name);

class CudaFp8Kv : public Cuda, public ::testing::WithParamInterface<std::string> {};

// --kv-cache-dtype fp8_e4m3 on both backends (E4M3 keys and values at the checkpoint's scales,
// 1 here; MLA's latent rows and DSA index keys at 1): every family's GPU run against the CPU's
// over the same kind of cache. The two caches are not the same bytes: the GPU rounds BF16
// activations to E4M3, the CPU F32 ones, so wherever the two straddle an E4M3 rounding
// boundary the values differ by a whole E4M3 step (2^-3 of a value). That is one FP8 rounding
// apart, what tests/model/fp8_kv_cache_test.cpp bounds between the CPU's FP8 and F32 caches,
// and these are its bounds: mean |dlogprob| 0.3 over the shared tokens, any one 2.0; at a
// parting, each run's token is in the other's top 5. (Measured on the GQA families, 2026-12-02:
// means 0.006-0.007, the largest one 0.023-0.072 a family; the BF16 rule above, 0.05, is for
// runs one BF16 rounding apart.) The kernels themselves are held to the BF16 tolerances on the
// same bytes (AttentionCudaTest's fp8_ cases, BackendParityFp8Kv).
constexpr double kFp8MeanLogprobTolerance = 0.3, kFp8LogprobTolerance = 2.0;

TEST_P(CudaFp8Kv, BatchedEngineMatchesTheCpusFp8Cache) {
  const auto dir = testing::fixtures_dir() / GetParam();
  auto cpu = ops::make_cpu_backend(0, DType::F8_E4M3);
  auto fp8_gpu = ops::make_backend({.device = "cuda", .kv_cache_dtype = DType::F8_E4M3});
  auto cpu_model = model::load_model(dir, *cpu, {.dummy = true});
  auto gpu_model = model::load_model(dir, *fp8_gpu, {.dummy = true});
  const auto reqs = mixed_requests(12, cpu_model->config().vocab_size, 7);
  const auto want = run_engine(*cpu_model, *cpu, reqs, small_engine());
  const auto got = run_engine(*gpu_model, *fp8_gpu, reqs, small_engine());
  size_t shared = 0;
  double sum = 0, worst = 0;
  for (size_t r = 0; r < reqs.size(); ++r) {
    const std::string what = GetParam() + " FP8 KV request " + std::to_string(r);
    ASSERT_EQ(got[r].tokens.size(), want[r].tokens.size()) << what;
    size_t i = 0;
    for (; i < want[r].tokens.size() && got[r].tokens[i] == want[r].tokens[i]; ++i) {
      const double d = std::abs(double(got[r].logprobs[i]) - want[r].logprobs[i]);
      worst = std::max(worst, d);
      sum += d;
    }
    shared += i;
    if (i < want[r].tokens.size()) {
      EXPECT_TRUE(in_top(got[r].top[i], want[r].tokens[i])) << what << ": parts at " << i;
      EXPECT_TRUE(in_top(want[r].top[i], got[r].tokens[i])) << what << ": parts at " << i;
    }
    std::printf("  %-48s %zu/%zu tokens equal\n", what.c_str(), i, want[r].tokens.size());
  }
  ASSERT_GT(shared, 0u);
  EXPECT_LE(worst, kFp8LogprobTolerance);
  EXPECT_LE(sum / double(shared), kFp8MeanLogprobTolerance);
  std::printf("  %s: |dlogprob| max %.2e, mean %.2e over %zu shared tokens\n", GetParam().c_str(), worst,
              sum / double(shared), shared);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaFp8Kv,
                         ::testing::Values("qwen3_moe-small-config", "qwen3_moe-small-nvfp4-config",
                                           "glm4_moe-small-config", "mixtral-small-config",
                                           "deepseek_v3-small-config", "glm_moe_dsa-small-config"),
                         testing::fixture_test_name);

// The engine's behaviours on the GPU, each against the same requests run one at a time on
// the GPU: batching, chunked prefill, preemption (a pool too small for everyone at once), the
// prefix cache (requests sharing a prompt prefix) and abort. The dense variant has no router,
// so nothing but the batch's numerics separates the two runs.
class CudaEngine : public Cuda, public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaEngine, BatchingChunkingPreemptionAndPrefixCache) {
  const auto dir = testing::fixtures_dir() / GetParam();
  auto model = model::load_model(dir, *gpu, {.dummy = true});
  auto reqs = mixed_requests(16, model->config().vocab_size, 11);
  // Four requests share the first 64 tokens of request 0's prompt.
  reqs[0].prompt.resize(std::max<size_t>(reqs[0].prompt.size(), 100), 5);
  for (int i = 1; i <= 4; ++i) {
    std::vector<int32_t> p(reqs[0].prompt.begin(), reqs[0].prompt.begin() + 64);
    p.insert(p.end(), reqs[size_t(i)].prompt.begin(), reqs[size_t(i)].prompt.end());
    reqs[size_t(i)].prompt = p;
  }
  std::vector<Generated> alone;
  for (const auto& p : reqs) alone.push_back(run_engine(*model, *gpu, {p}, small_engine())[0]);
  runtime::EngineConfig tight = small_engine();
  tight.chunked_prefill_size = 24;  // long prompts take several steps
  tight.max_running_requests = 8;
  runtime::EngineStats stats;
  const auto together = run_engine(*model, *gpu, reqs, tight, &stats);
  EXPECT_GT(stats.prefix_cache_hit_tokens, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<double> lp(alone[i].logprobs.begin(), alone[i].logprobs.end());
    expect_close(together[i], alone[i].tokens, lp, alone[i].top, GetParam() + " request " + std::to_string(i));
  }
  // Preemption: four requests that all fit their prompts but not their 48 new tokens (each
  // needs up to 17 blocks of 4 tokens, the pool holds 40): recomputed ones go on where they were.
  std::vector<runtime::RequestParams> grow;
  for (int i = 0; i < 4; ++i) {
    auto p = reqs[size_t(5 + i)];
    p.prompt.resize(size_t(10 + 3 * i), 7);
    p.max_new_tokens = 48;
    grow.push_back(p);
  }
  runtime::EngineConfig small_pool = small_engine();
  small_pool.block_size = 4;
  small_pool.kv_blocks = 40;
  std::vector<Generated> grow_alone;
  for (const auto& p : grow) grow_alone.push_back(run_engine(*model, *gpu, {p}, small_pool)[0]);
  const auto preempted = run_engine(*model, *gpu, grow, small_pool, &stats);
  EXPECT_GT(stats.preemptions, 0) << "the pool is too large to force preemption";
  for (size_t i = 0; i < grow.size(); ++i) {
    std::vector<double> lp(grow_alone[i].logprobs.begin(), grow_alone[i].logprobs.end());
    expect_close(preempted[i], grow_alone[i].tokens, lp, grow_alone[i].top,
                 GetParam() + " preempted request " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngine,
                         ::testing::Values("qwen3_moe-small-nvfp4-config", "qwen3_moe-small-dense-config",
                                           "glm_moe_dsa-small-config"),
                         testing::fixture_test_name);

// Decode graphs: a replay runs the kernels of the padded eager step with the same arguments,
// so requests arriving and finishing (batches of 3, 5, 6, 7 padded to 4 and 8) get exactly
// the tokens and log-probs of that eager step; and a batch of a captured size gets exactly
// plain eager decode's (its attention splits do not depend on the plan's context).
class CudaGraphs : public Cuda, public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaGraphs, ReplayEqualsTheEagerStep) {
  const auto dir = testing::fixtures_dir() / GetParam();
  auto model = model::load_model(dir, *gpu, {.dummy = true});
  const auto reqs = mixed_requests(9, model->config().vocab_size, 3);
  runtime::EngineConfig graphs = small_engine();
  graphs.max_running_requests = 8;  // sizes 1, 2, 4, 8
  runtime::EngineConfig padded_eager = graphs;
  padded_eager.testing_eager_decode_graphs = true;
  runtime::EngineStats with_graphs, eager;
  const auto got = run_engine(*model, *gpu, reqs, graphs, &with_graphs, true);
  const auto want = run_engine(*model, *gpu, reqs, padded_eager, &eager, true);
  EXPECT_GT(with_graphs.graph_steps, 0);
  EXPECT_EQ(with_graphs.graph_steps, eager.graph_steps);
  expect_same(got, want, GetParam() + " padded");

  // Four requests decoding in lockstep: every decode step is a batch of 4, a captured size.
  std::vector<runtime::RequestParams> lockstep(reqs.begin(), reqs.begin() + 4);
  for (auto& p : lockstep) p.max_new_tokens = 24;
  runtime::EngineConfig no_graphs = graphs;
  no_graphs.disable_cuda_graph = true;
  runtime::EngineStats s;
  const auto replayed = run_engine(*model, *gpu, lockstep, graphs, &s);
  EXPECT_GT(s.graph_steps, 20);
  const auto plain = run_engine(*model, *gpu, lockstep, no_graphs, &s);
  EXPECT_EQ(s.graph_steps, 0);
  expect_same(replayed, plain, GetParam() + " lockstep");
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGraphs,
                         ::testing::Values("qwen3_moe-small-nvfp4-config", "qwen3_moe-small-dense-config",
                                           "glm4_moe-small-config", "mixtral-small-config",
                                           "deepseek_v3-small-config", "glm_moe_dsa-small-config"),
                         testing::fixture_test_name);

TEST_F(Cuda, ALongPromptsLastChunksFitTheStepArena) {
  // One prompt near the end of the context, in 512-token chunks: its last chunks' prefill
  // attention splits the keys into scratch that a short prompt never needs. The measuring pass
  // must have sized the arena for it (an 8,192-token prompt once ended its server with
  // "the step arena ... has no room").
  const auto dir = testing::fixtures_dir() / "qwen3_moe-small-nvfp4-config";
  auto model = model::load_model(dir, *gpu, {.dummy = true});
  runtime::EngineConfig c = small_engine();
  c.chunked_prefill_size = 512;
  const int64_t context = model->config().max_position_embeddings;
  std::vector<int32_t> prompt(size_t(context - 8));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + i % 1000);
  runtime::EngineStats stats;
  const auto out = run_engine(*model, *gpu, {greedy(prompt, 4)}, c, &stats);
  EXPECT_EQ(stats.failed_steps, 0);
  EXPECT_EQ(out[0].tokens.size(), 4u);
}

TEST_F(Cuda, AbortFreesEverythingMidStream) {
  const auto dir = testing::fixtures_dir() / "qwen3_moe-tiny";
  auto model = model::load_model(dir, *gpu);
  runtime::Engine engine(*model, *gpu, small_engine());
  std::vector<uint64_t> ids;
  int finished = 0;
  for (int i = 0; i < 6; ++i)
    ids.push_back(engine
                      .submit(greedy(std::vector<int32_t>(size_t(20 + i), 7), 200),
                              [&](const runtime::RequestOutput& o) { finished += o.finish != runtime::FinishReason::None; })
                      .request_id);
  for (int s = 0; s < 5; ++s) engine.step();
  for (uint64_t id : ids) engine.abort(id);
  engine.step();
  EXPECT_EQ(finished, 6);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_EQ(engine.stats().running, 0);
}

}  // namespace
}  // namespace tetra
