// The CUDA backend split over ranks (--tp 2, --ep 2, both), every rank on GPU 0 and joined by
// the CUDA peer communicator: the machine the tests run on has one GPU. The sharded kernels
// (a rank's heads, its experts from first_expert on, narrower experts) and the collectives run
// as they would over several GPUs; only the communicator's transport differs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <random>

#include "cuda_model_util.h"

namespace tetra {
namespace {

using namespace cuda_testing;

struct Split {
  const char* fixture;
  int tp, ep;
};

std::string split_name(const ::testing::TestParamInfo<Split>& i) {
  return testing::gtest_name(str_cat(i.param.fixture, "_tp", i.param.tp, "_ep", i.param.ep));
}

std::vector<Split> splits_of(std::initializer_list<const char*> fixtures) {
  std::vector<Split> out;
  for (const char* f : fixtures)
    for (auto [tp, ep] : {std::pair{2, 1}, {1, 2}, {2, 2}}) out.push_back({f, tp, ep});
  return out;
}

int world_of(const Split& sp) { return std::max(sp.tp, sp.ep); }

// Every rank on GPU 0 (the default: the test machine has one), or on a GPU of its own.
std::vector<int> own_gpus(const Split& sp) {
  std::vector<int> devices;
  for (int r = 0; r < world_of(sp); ++r) devices.push_back(r);
  return devices;
}

std::unique_ptr<runtime::ModelRanks> cuda_ranks(const std::filesystem::path& dir, const Split& sp,
                                                const model::LoadOptions& options = {},
                                                std::vector<int> devices = {}) {
  if (devices.empty()) devices.assign(size_t(world_of(sp)), 0);
  return runtime::load_ranks(dir, {.device = "cuda"}, {sp.tp, sp.ep}, options, nullptr, devices);
}

class CudaParallelFixture : public ::testing::TestWithParam<Split> {
 protected:
  void SetUp() override {
    if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// A fixture split over ranks on `devices`, batched in the engine, against transformers' greedy
// tokens and log-probs by the rule one GPU is held to.
void expect_split_matches_transformers(const Split& sp, const std::vector<int>& devices) {
  const auto dir = testing::fixtures_dir() / sp.fixture;
  const auto cases = testing::read_cases(dir);
  ASSERT_FALSE(cases.empty());
  const std::vector<size_t> checked = positions_before_router_ties(dir, cases);
  auto split = cuda_ranks(dir, sp, {}, devices);
  ASSERT_EQ(split->size(), world_of(sp));
  std::vector<runtime::RequestParams> reqs;
  for (const auto& c : cases) reqs.push_back(greedy(c.prompt_ids, c.max_new_tokens));
  const auto runs = run_engine(*split, reqs, small_engine());
  for (size_t i = 0; i < cases.size(); ++i)
    expect_close(runs[i], cases[i].token_ids, cases[i].logprobs, {},
                 str_cat(sp.fixture, " tp ", sp.tp, " ep ", sp.ep, " case ", i), checked[i]);
}

// Every shipped fixture, each split, every rank on GPU 0.
TEST_P(CudaParallelFixture, EngineMatchesTransformers) { expect_split_matches_transformers(GetParam(), {}); }

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaParallelFixture,
    ::testing::ValuesIn(splits_of({"qwen3_moe-tiny", "qwen3_moe-nonorm", "glm4_moe-tiny", "mixtral-tiny",
                                   "qwen3_moe-tiny-nvfp4", "qwen3_moe-nonorm-nvfp4", "glm4_moe-tiny-nvfp4",
                                   "mixtral-tiny-nvfp4", "deepseek_v3-tiny", "deepseek_v3-noqlora",
                                   "glm4_moe_lite-tiny", "glm_moe_dsa-tiny", "deepseek_v3-tiny-nvfp4",
                                   "deepseek_v3-noqlora-nvfp4", "glm4_moe_lite-tiny-nvfp4", "glm_moe_dsa-tiny-nvfp4"})),
    split_name);

// The same on GPUs of their own where the machine has enough (peer memory over NVLink, NCCL for
// the large messages): a fixture of each family, each split.
class CudaParallelOwnGpus : public CudaParallelFixture {};

TEST_P(CudaParallelOwnGpus, EngineMatchesTransformers) {
  if (ops::cuda_device_count() < world_of(GetParam())) GTEST_SKIP() << "fewer than " << world_of(GetParam()) << " GPUs";
  expect_split_matches_transformers(GetParam(), own_gpus(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParallelOwnGpus,
                         ::testing::ValuesIn(splits_of({"qwen3_moe-tiny-nvfp4", "glm4_moe-tiny", "mixtral-tiny-nvfp4",
                                                        "deepseek_v3-tiny-nvfp4", "glm_moe_dsa-tiny-nvfp4"})),
                         split_name);

class CudaParallelDummy : public CudaParallelFixture {};

// The families' proportions at small size with dummy weights, split the same way on both
// backends (a rank's dummy weights are drawn from its shard's seed, the same numbers on each):
// the CPU's ranks against the GPU's, 12 requests batched. Experts of 128 take the fast MoE
// kernels (the fused decode kernel among them for NVFP4) where a rank holds them whole (--ep),
// the general ones where --tp halves them.
//
// Tokens by the rule of cuda_model_util.h. Log-probs by their mean and their largest
// difference, as CudaFp8Kv holds them: dummy routers' logits are a few tenths, so a prompt of
// 100 tokens nearly always holds a router gap under 1e-3, and the near-tie cut of the fixtures
// would leave almost nothing compared. Measured (H200, 2026-12-04): means 1.3-2.6e-3 a split,
// the largest differences up to 0.026, and 0.064 once, after BF16 flipped a prefill's router
// gap of 5e-5 (glm4_moe tp 1 ep 2, request 7). A wrong row, expert or rank moves them by whole
// units.
constexpr double kSplitMeanLogprobTolerance = 0.01, kSplitLogprobTolerance = 0.1;

TEST_P(CudaParallelDummy, BatchedEngineMatchesTheCpusRanks) {
  const Split& sp = GetParam();
  const auto dir = testing::fixtures_dir() / sp.fixture;
  auto cpu = runtime::load_ranks(dir, {.device = "cpu"}, {sp.tp, sp.ep}, {.dummy = true});
  auto gpu = cuda_ranks(dir, sp, {.dummy = true});
  const auto reqs = mixed_requests(12, cpu->model().config().vocab_size, 7);
  const auto want = run_engine(*cpu, reqs, small_engine());
  const auto got = run_engine(*gpu, reqs, small_engine());
  size_t shared = 0;
  double sum = 0, worst = 0;
  for (size_t r = 0; r < reqs.size(); ++r) {
    const std::string what = str_cat(sp.fixture, " tp ", sp.tp, " ep ", sp.ep, " request ", r);
    std::vector<double> lp(want[r].logprobs.begin(), want[r].logprobs.end());
    expect_close(got[r], want[r].tokens, lp, want[r].top, what, /*logprob_positions=*/0);
    for (size_t i = 0; i < lp.size() && got[r].tokens[i] == want[r].tokens[i]; ++i, ++shared) {
      const double d = std::abs(double(got[r].logprobs[i]) - lp[i]);
      worst = std::max(worst, d);
      sum += d;
    }
  }
  ASSERT_GT(shared, 0u);
  EXPECT_LE(sum / double(shared), kSplitMeanLogprobTolerance);
  EXPECT_LE(worst, kSplitLogprobTolerance);
  std::printf("  %s tp %d ep %d: |dlogprob| mean %.2e, max %.2e over %zu shared tokens\n", sp.fixture, sp.tp, sp.ep,
              sum / double(shared), worst, shared);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaParallelDummy,
                         ::testing::ValuesIn(splits_of({"qwen3_moe-small-nvfp4-config", "glm4_moe-small-config",
                                                        "mixtral-small-config", "deepseek_v3-small-config"})),
                         split_name);

class CudaParallelGraphs : public CudaParallelFixture {};

// Split models' decode graphs: every rank captures its step, collectives (fused with the norms)
// inside, and replays it on its own thread. Against each rank's eager steps padded to the same
// batch sizes (the same kernels in the same order), requests joining and leaving mid-batch.
void expect_graphs_replay_the_eager_steps(const Split& sp, const std::vector<int>& devices) {
  auto ranks = cuda_ranks(testing::fixtures_dir() / sp.fixture, sp, {.dummy = true}, devices);
  const auto reqs = mixed_requests(9, ranks->model().config().vocab_size, 3);
  runtime::EngineConfig graphs = small_engine();
  graphs.max_running_requests = 8;  // sizes 1, 2, 4, 8
  runtime::EngineConfig padded_eager = graphs;
  padded_eager.testing_eager_decode_graphs = true;
  runtime::EngineStats with_graphs, eager;
  const auto got = run_engine(*ranks, reqs, graphs, &with_graphs, true);
  const auto want = run_engine(*ranks, reqs, padded_eager, &eager, true);
  EXPECT_GT(with_graphs.graph_steps, 0);
  EXPECT_EQ(with_graphs.graph_steps, eager.graph_steps);
  expect_same(got, want, str_cat(sp.fixture, " tp ", sp.tp, " ep ", sp.ep));
}

TEST_P(CudaParallelGraphs, ReplayEqualsTheEagerStep) { expect_graphs_replay_the_eager_steps(GetParam(), {}); }

TEST_P(CudaParallelGraphs, ReplayEqualsTheEagerStepOnGpusOfTheirOwn) {
  if (ops::cuda_device_count() < world_of(GetParam())) GTEST_SKIP() << "fewer than " << world_of(GetParam()) << " GPUs";
  expect_graphs_replay_the_eager_steps(GetParam(), own_gpus(GetParam()));
}

// A rank that fails before replaying its decode graph: the others' graphs wait in their first
// collective on the GPU until the abort frees them; the step fails, and so does every later
// one (the group is over), without a hang.
class CudaParallelFault : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaParallelFault, ARankThatFailsAtAGraphStepEndsTheGroupWithoutHanging) {
  auto ranks = cuda_ranks(testing::fixtures_dir() / "qwen3_moe-small-nvfp4-config", {"", 2, 1}, {.dummy = true});
  runtime::EngineConfig c = small_engine();
  c.testing_fail_step = 3;  // a decode step of one sequence: a graph step
  c.testing_fail_rank = 1;
  runtime::Engine engine(*ranks, c);
  std::vector<runtime::FinishReason> finish;
  auto submit = [&] {
    const auto r = engine.submit(greedy({5, 6, 7, 8}, 8), [&](const runtime::RequestOutput& o) {
      if (o.finish != runtime::FinishReason::None) finish.push_back(o.finish);
    });
    ASSERT_EQ(r.error, runtime::SubmitError::None) << r.message;
  };
  auto drain = [&] {
    auto done = std::async(std::launch::async, [&] {
      while (engine.step()) {
      }
    });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the ranks hung";
    done.get();
  };
  submit();
  drain();
  ASSERT_EQ(finish.size(), 1u);
  EXPECT_EQ(finish[0], runtime::FinishReason::Error);
  EXPECT_GE(engine.stats().graph_steps, 1);  // the steps before the fault replayed graphs
  EXPECT_EQ(engine.stats().failed_steps, 1);
  submit();
  drain();
  ASSERT_EQ(finish.size(), 2u);
  EXPECT_EQ(finish[1], runtime::FinishReason::Error);
  EXPECT_EQ(engine.stats().failed_steps, 2);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaParallelGraphs,
                         ::testing::ValuesIn(splits_of({"qwen3_moe-small-nvfp4-config", "glm4_moe-small-config",
                                                        "deepseek_v3-small-config"})),
                         split_name);

}  // namespace
}  // namespace tetra
