// Every fixture split over ranks (--tp 2, --ep 2, both, and wider splits where the shapes
// allow) against the same model on one rank: greedy tokens equal, log-probs within 1e-4. The
// ranks are threads of this process joined by the CPU communicator.
#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/ranks.h"

namespace tetra {
namespace {

struct Split {
  const char* fixture;
  int tp, ep;
};

std::string name_of(const Split& s) { return testing::gtest_name(str_cat(s.fixture, "_tp", s.tp, "_ep", s.ep)); }

class ParallelParity : public ::testing::TestWithParam<Split> {};

TEST_P(ParallelParity, GreedyTokensAndLogprobsMatchOneRank) {
  const Split& sp = GetParam();
  const auto dir = testing::fixtures_dir() / sp.fixture;
  const ops::BackendOptions cpu{.device = "cpu", .n_threads = 1};
  auto one = runtime::load_ranks(dir, cpu, {1, 1}, {});
  auto split = runtime::load_ranks(dir, cpu, {sp.tp, sp.ep}, {});
  ASSERT_EQ(split->size(), std::max(sp.tp, sp.ep));
  const auto cases = testing::read_cases(dir);
  ASSERT_FALSE(cases.empty());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const runtime::GenerateOptions opts{.max_new_tokens = c.max_new_tokens, .ignore_eos = true};
    const auto want = runtime::generate(*one, c.prompt_ids, opts);
    const auto got = runtime::generate(*split, c.prompt_ids, opts);
    EXPECT_EQ(got.token_ids, want.token_ids) << "case " << i;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    double worst = 0;
    for (size_t t = 0; t < got.logprobs.size(); ++t)
      worst = std::max(worst, std::abs(double(got.logprobs[t]) - double(want.logprobs[t])));
    EXPECT_LE(worst, 1e-4) << "case " << i << ": largest log-prob difference";
    RecordProperty("max_logprob_diff_case" + std::to_string(i), std::to_string(worst));
    std::printf("%s tp %d ep %d case %zu: %zu tokens equal, max |dlogprob| = %.2e\n", sp.fixture, sp.tp, sp.ep, i,
                got.token_ids.size(), worst);
  }
}

std::vector<Split> splits() {
  const char* fixtures[] = {"qwen3_moe-tiny",         "qwen3_moe-nonorm",         "glm4_moe-tiny",
                            "mixtral-tiny",           "deepseek_v3-tiny",         "deepseek_v3-noqlora",
                            "glm4_moe_lite-tiny",     "glm_moe_dsa-tiny",         "qwen3_moe-tiny-nvfp4",
                            "qwen3_moe-nonorm-nvfp4", "glm4_moe-tiny-nvfp4",      "mixtral-tiny-nvfp4",
                            "deepseek_v3-tiny-nvfp4", "deepseek_v3-noqlora-nvfp4", "glm4_moe_lite-tiny-nvfp4",
                            "glm_moe_dsa-tiny-nvfp4"};
  std::vector<Split> out;
  for (const char* f : fixtures)
    for (auto [tp, ep] : {std::pair{2, 1}, {1, 2}, {2, 2}}) out.push_back({f, tp, ep});
  // Four ranks: KV heads replicated (2 KV heads over 4 ranks), experts in 2 groups of 2
  // ranks that split each expert's width, and 4 expert groups with attention whole.
  out.push_back({"qwen3_moe-tiny", 4, 1});
  out.push_back({"qwen3_moe-tiny", 4, 2});
  out.push_back({"glm4_moe-tiny-nvfp4", 4, 4});
  out.push_back({"deepseek_v3-tiny", 4, 2});
  out.push_back({"glm_moe_dsa-tiny-nvfp4", 1, 4});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, ParallelParity, ::testing::ValuesIn(splits()),
                         [](const auto& info) { return name_of(info.param); });

TEST(ParallelLoad, ShapesTheRanksCannotSplitAreOneSentence) {
  const auto dir = testing::fixtures_dir() / "qwen3_moe-tiny";  // 4 heads, 8 experts
  const ops::BackendOptions cpu{.device = "cpu", .n_threads = 1};
  try {
    runtime::load_ranks(dir, cpu, {8, 1}, {});
    FAIL() << "loaded 4 heads on 8 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tp 8 must divide the model's 4 attention heads"), std::string::npos)
        << e.what();
  }
  try {
    runtime::load_ranks(dir, cpu, {1, 3}, {});
    FAIL() << "loaded 8 experts on 3 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ep 3 must divide the model's 8 routed experts"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(runtime::load_ranks(dir, cpu, {2, 4}, {}), Error);
}

TEST(ParallelLoad, EachRankHoldsItsPartOfTheWeights) {
  const auto dir = testing::fixtures_dir() / "qwen3_moe-tiny";
  const ops::BackendOptions cpu{.device = "cpu", .n_threads = 1};
  auto one = runtime::load_ranks(dir, cpu, {1, 1}, {});
  auto two = runtime::load_ranks(dir, cpu, {2, 2}, {});
  const auto whole = one->model().load_stats();
  const auto r0 = two->model(0).load_stats(), r1 = two->model(1).load_stats();
  EXPECT_EQ(r0.routed_expert_bytes + r1.routed_expert_bytes, whole.routed_expert_bytes);
  EXPECT_LT(r0.bytes, whole.bytes);
  // Each rank's KV cache holds its half of the KV heads.
  EXPECT_EQ(two->model(1).kv_layout()[0].n_kv_heads * 2, one->model().kv_layout()[0].n_kv_heads);
}

}  // namespace
}  // namespace tetra
