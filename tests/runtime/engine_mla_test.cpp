// The serving engine on the MLA families (deepseek_v3 with and without q_lora, glm4_moe_lite,
// glm_moe_dsa with its DSA indexer, BF16 and one NVFP4) on the CPU: several sequences of mixed
// lengths in one batch, staggered arrivals under chunked prefill, the prefix cache, preemption
// and padded decode batches each give every request exactly what it gets alone through
// generate() (expect_matches_generate: the same greedy tokens, log-probs within 1e-5).
//
// glm_moe_dsa-tiny's index_topk is 4, so prompts of 1 to 3 tokens attend to every key and the
// longer ones (up to 45, and a 40-token shared prefix) to the indexer's 4 picks only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::EngineConfig;
using runtime::RequestParams;
using testing::Collector;
using testing::expect_matches_generate;

class EngineMla : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { models_ = new std::map<std::string, std::unique_ptr<testing::TinyModel>>; }
  static void TearDownTestSuite() {
    delete models_;
    models_ = nullptr;
  }
  // One load per fixture for the whole suite.
  testing::TinyModel& model() {
    auto& m = (*models_)[GetParam()];
    if (!m) m = std::make_unique<testing::TinyModel>(std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures" / GetParam());
    return *m;
  }

  std::vector<RequestParams> mixed(int n, uint32_t seed) { return testing::mixed_requests(model(), n, seed); }
  runtime::EngineStats run_and_compare(const EngineConfig& config, const std::vector<RequestParams>& requests,
                                       bool staggered) {
    return testing::run_and_compare(model(), config, requests, staggered, GetParam() + " ");
  }

 private:
  static std::map<std::string, std::unique_ptr<testing::TinyModel>>* models_;
};

std::map<std::string, std::unique_ptr<testing::TinyModel>>* EngineMla::models_ = nullptr;

TEST_P(EngineMla, TheFixtureIsMla) {
  const ModelConfig& c = model().model->config();
  EXPECT_TRUE(c.is_mla()) << GetParam();
  if (c.family == ModelFamily::GlmMoeDsa) {
    // The prompts below must fall on both sides of the indexer's top-k.
    EXPECT_EQ(c.index_topk, 4);
    int64_t shorter = 0, longer = 0;
    for (const auto& p : mixed(12, 1)) (int64_t(p.prompt.size()) < c.index_topk ? shorter : longer) += 1;
    EXPECT_GT(shorter, 0);
    EXPECT_GT(longer, 0);
  }
}

TEST_P(EngineMla, BatchOfMixedLengthsEqualsEachAlone) {
  const auto s = run_and_compare(testing::small_config(), mixed(12, 1), false);
  EXPECT_EQ(s.preemptions, 0);
}

TEST_P(EngineMla, StaggeredArrivalsUnderChunkedPrefill) {
  // 7-token prefill chunks and 3 running at most: steps mix decodes with prompt chunks that
  // start mid-prompt, reading the latent cache their earlier chunks wrote.
  EngineConfig c = testing::small_config();
  c.chunked_prefill_size = 7;
  c.max_running_requests = 3;
  run_and_compare(c, mixed(9, 6), true);
}

TEST_P(EngineMla, PrefixCachedPrefillEqualsTheWholePrompt) {
  // A 40-token prefix: the second request reads its first 40 positions' latents (and DSA
  // index keys) from the first one's blocks and computes only its own tail.
  testing::TinyModel& m = model();
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  std::mt19937 rng(11);
  const auto prefix = testing::random_prompt(rng, 41, m.vocab());
  auto first = testing::greedy(prefix, 6);
  auto second = testing::greedy(std::vector<int32_t>(prefix.begin(), prefix.begin() + 40), 8);
  for (int32_t t : testing::random_prompt(rng, 7, m.vocab())) second.prompt.push_back(t);
  const auto id1 = testing::submit_ok(engine, first, out);
  testing::drain(engine);
  // The second beside a short newcomer in the same steps.
  const auto id2 = testing::submit_ok(engine, second, out);
  const auto short_one = testing::greedy({9, 8}, 5);
  const auto id3 = testing::submit_ok(engine, short_one, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[id2].cached_prompt_tokens, 40);
  expect_matches_generate(m, first, out.by_id[id1], GetParam() + " first");
  expect_matches_generate(m, second, out.by_id[id2], GetParam() + " prefix-cached");
  expect_matches_generate(m, short_one, out.by_id[id3], GetParam() + " beside it");
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_P(EngineMla, PreemptionByRecomputeKeepsGreedyTokens) {
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.kv_blocks = 14;  // one request needs up to 11 blocks; four at once cannot fit
  std::mt19937 rng(3);
  std::vector<RequestParams> requests;
  for (int i = 0; i < 4; ++i)
    requests.push_back(testing::greedy(testing::random_prompt(rng, 10 + 3 * i, model().vocab()), 20));
  const auto s = run_and_compare(c, requests, false);
  EXPECT_GT(s.preemptions, 0);
}

TEST_P(EngineMla, DecodeBatchesPaddedToGraphSizes) {
  // Decode batches padded as a CUDA graph replay pads them, run eagerly: the padding rows
  // (no cache slot, no sequence) change no real row's attention or indexer choice.
  EngineConfig c = testing::small_config();
  c.max_running_requests = 6;
  c.testing_eager_decode_graphs = true;
  const auto s = run_and_compare(c, mixed(9, 4), true);
  EXPECT_GT(s.graph_steps, 0);
}

std::string fixture_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineMla,
                         ::testing::Values("deepseek_v3-tiny", "deepseek_v3-noqlora", "glm4_moe_lite-tiny",
                                           "glm_moe_dsa-tiny", "glm_moe_dsa-tiny-nvfp4"),
                         fixture_name);

}  // namespace
}  // namespace tetra
