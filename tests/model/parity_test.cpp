// Every family against transformers: greedy tokens equal, log-probs within 1e-4.
#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.h"
#include "model/model.h"
#include "runtime/generate.h"

namespace tetra {
namespace {

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, GreedyTokensAndLogprobsMatchTransformers) {
  const auto dir = testing::fixtures_dir() / GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir / "expected.json")) << dir << " is missing";
  auto backend = ops::make_cpu_backend(2);
  auto model = model::load_model(dir, *backend);
  const auto cases = testing::read_cases(dir);
  ASSERT_FALSE(cases.empty());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    runtime::GenerateOptions opts{.max_new_tokens = c.max_new_tokens, .ignore_eos = true};
    const auto r = runtime::generate(*model, *backend, c.prompt_ids, opts);
    EXPECT_EQ(r.token_ids, c.token_ids) << "case " << i;
    ASSERT_EQ(r.logprobs.size(), c.logprobs.size());
    double worst = 0;
    for (size_t t = 0; t < c.logprobs.size(); ++t)
      worst = std::max(worst, std::abs(double(r.logprobs[t]) - c.logprobs[t]));
    EXPECT_LE(worst, 1e-4) << "case " << i << ": largest log-prob difference";
    RecordProperty("max_logprob_diff_case" + std::to_string(i), std::to_string(worst));
    std::printf("%s case %zu: %zu tokens equal, max |dlogprob| = %.2e\n", GetParam().c_str(), i,
                c.token_ids.size(), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Parity,
                         ::testing::Values("qwen3_moe-tiny", "qwen3_moe-nonorm", "glm4_moe-tiny",
                                           "mixtral-tiny", "deepseek_v3-tiny",
                                           "deepseek_v3-noqlora", "glm4_moe_lite-tiny",
                                           "glm_moe_dsa-tiny",
                                           // NVFP4 (W4A16) checkpoints against transformers run
                                           // on their dequantized weights
                                           "qwen3_moe-tiny-nvfp4", "qwen3_moe-nonorm-nvfp4",
                                           "glm4_moe-tiny-nvfp4", "mixtral-tiny-nvfp4",
                                           "deepseek_v3-tiny-nvfp4", "deepseek_v3-noqlora-nvfp4",
                                           "glm4_moe_lite-tiny-nvfp4", "glm_moe_dsa-tiny-nvfp4"),
                         testing::fixture_test_name);

}  // namespace
}  // namespace tetra
