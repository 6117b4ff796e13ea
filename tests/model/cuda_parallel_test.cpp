// The CUDA backend split over ranks (--tp 2, --ep 2, both), every rank on GPU 0 and joined by
// the CUDA thread communicator: the machine the tests run on has one GPU. The sharded kernels
// (a rank's heads, its experts from first_expert on, narrower experts) and the collectives run
// as they would over several GPUs; only the communicator's transport differs.
#include <gtest/gtest.h>

#include <cstdio>
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

std::unique_ptr<runtime::ModelRanks> cuda_ranks(const std::filesystem::path& dir, const Split& sp,
                                                const model::LoadOptions& options = {}) {
  const int world = std::max(sp.tp, sp.ep);
  return runtime::load_ranks(dir, {.device = "cuda"}, {sp.tp, sp.ep}, options, nullptr, std::vector<int>(size_t(world), 0));
}

class CudaParallelFixture : public ::testing::TestWithParam<Split> {
 protected:
  void SetUp() override {
    if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Every shipped fixture split, batched in the engine, against transformers' greedy tokens and
// log-probs by the rule one GPU is held to.
TEST_P(CudaParallelFixture, EngineMatchesTransformers) {
  const Split& sp = GetParam();
  const auto dir = testing::fixtures_dir() / sp.fixture;
  const auto cases = testing::read_cases(dir);
  ASSERT_FALSE(cases.empty());
  const std::vector<size_t> checked = positions_before_router_ties(dir, cases);
  auto split = cuda_ranks(dir, sp);
  ASSERT_EQ(split->size(), std::max(sp.tp, sp.ep));
  std::vector<runtime::RequestParams> reqs;
  for (const auto& c : cases) reqs.push_back(greedy(c.prompt_ids, c.max_new_tokens));
  const auto runs = run_engine(*split, reqs, small_engine());
  for (size_t i = 0; i < cases.size(); ++i)
    expect_close(runs[i], cases[i].token_ids, cases[i].logprobs, {},
                 str_cat(sp.fixture, " tp ", sp.tp, " ep ", sp.ep, " case ", i), checked[i]);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaParallelFixture,
    ::testing::ValuesIn(splits_of({"qwen3_moe-tiny", "qwen3_moe-nonorm", "glm4_moe-tiny", "mixtral-tiny",
                                   "qwen3_moe-tiny-nvfp4", "qwen3_moe-nonorm-nvfp4", "glm4_moe-tiny-nvfp4",
                                   "mixtral-tiny-nvfp4", "deepseek_v3-tiny", "deepseek_v3-noqlora",
                                   "glm4_moe_lite-tiny", "glm_moe_dsa-tiny", "deepseek_v3-tiny-nvfp4",
                                   "deepseek_v3-noqlora-nvfp4", "glm4_moe_lite-tiny-nvfp4", "glm_moe_dsa-tiny-nvfp4"})),
    split_name);

class CudaParallelDummy : public CudaParallelFixture {};

// The families' proportions at small size with dummy weights, split the same way on both
// backends (a rank's dummy weights are drawn from its shard's seed, the same numbers on each):
// the CPU's ranks against the GPU's, 12 requests batched, by the rule of cuda_model_util.h
// (log-probs up to a router near-tie of the CPU's run). Experts of 128 take the fast MoE
// kernels (the fused decode kernel among them for NVFP4) where a rank holds them whole (--ep),
// the general ones where --tp halves them.
TEST_P(CudaParallelDummy, BatchedEngineMatchesTheCpusRanks) {
  const Split& sp = GetParam();
  const auto dir = testing::fixtures_dir() / sp.fixture;
  // Rank 0 records its routers' gaps (every rank routes every token alike).
  auto recording = std::make_unique<RouterGaps>(ops::make_cpu_backend(0));
  const RouterGaps& gaps = *recording;
  auto cpu = runtime::load_ranks(dir, {.device = "cpu"}, {sp.tp, sp.ep}, {.dummy = true}, std::move(recording));
  auto gpu = cuda_ranks(dir, sp, {.dummy = true});
  const auto reqs = mixed_requests(12, cpu->model().config().vocab_size, 7);
  std::vector<size_t> checked;
  for (const auto& r : reqs) {
    const size_t before = gaps.min_gap_per_step().size();
    runtime::generate(*cpu, r.prompt, {.max_new_tokens = r.max_new_tokens, .ignore_eos = true});
    checked.push_back(positions_before_router_tie(
        std::vector<float>(gaps.min_gap_per_step().begin() + long(before), gaps.min_gap_per_step().end())));
  }
  const auto want = run_engine(*cpu, reqs, small_engine());
  const auto got = run_engine(*gpu, reqs, small_engine());
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<double> lp(want[i].logprobs.begin(), want[i].logprobs.end());
    expect_close(got[i], want[i].tokens, lp, want[i].top,
                 str_cat(sp.fixture, " tp ", sp.tp, " ep ", sp.ep, " request ", i), checked[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaParallelDummy,
                         ::testing::ValuesIn(splits_of({"qwen3_moe-small-nvfp4-config", "glm4_moe-small-config",
                                                        "mixtral-small-config", "deepseek_v3-small-config"})),
                         split_name);

}  // namespace
}  // namespace tetra
