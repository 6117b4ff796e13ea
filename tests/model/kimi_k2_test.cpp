// Kimi K2 as published: config.json says model_type "kimi_k2" in transformers 4.x spelling
// (rope_scaling with "type", rope_theta at the top, no rope_interleave or head_dim, its remote
// code's extra fields). It is DeepSeek-V3's architecture, so the deepseek_v3-tiny weights under
// such a config must give transformers' greedy tokens for deepseek_v3-tiny.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "model/model.h"
#include "runtime/generate.h"

namespace tetra {
namespace {

nlohmann::json kimi_style(nlohmann::json c) {
  c["model_type"] = "kimi_k2";
  const nlohmann::json rope = c["rope_parameters"];
  c.erase("rope_parameters");
  c.erase("rope_interleave");
  c.erase("head_dim");
  c.erase("qk_head_dim");
  c.erase("dtype");
  c["rope_theta"] = rope["rope_theta"];
  c["rope_scaling"] = {{"type", "yarn"}};
  for (const char* k : {"factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "original_max_position_embeddings"})
    c["rope_scaling"][k] = rope[k];
  c["auto_map"] = {{"AutoConfig", "configuration_deepseek.DeepseekV3Config"},
                   {"AutoModelForCausalLM", "modeling_deepseek.DeepseekV3ForCausalLM"}};
  c["scoring_func"] = "sigmoid";
  c["topk_method"] = "noaux_tc";
  c["seq_aux"] = true;
  c["aux_loss_alpha"] = 0.001;
  c["moe_layer_freq"] = 1;
  c["torch_dtype"] = "bfloat16";
  c["transformers_version"] = "4.48.3";
  return c;
}

TEST(KimiK2, LoadsAsDeepseekV3AndMatchesItsReference) {
  const auto src = testing::fixtures_dir() / "deepseek_v3-tiny";
  const auto dir = std::filesystem::temp_directory_path() / ("tetra_kimi_k2_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(src / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(src / "config.json");
  const nlohmann::json config = kimi_style(nlohmann::json::parse(in));
  ASSERT_FALSE(config.contains("rope_parameters"));
  std::ofstream(dir / "config.json") << config.dump(2);

  auto backend = ops::make_cpu_backend(2);
  auto model = model::load_model(dir, *backend);
  EXPECT_EQ(model->config().model_type, "kimi_k2");
  EXPECT_EQ(model->config().family, ModelFamily::DeepseekV3);
  const auto cases = testing::read_cases(src);
  ASSERT_FALSE(cases.empty());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const auto r = runtime::generate(*model, *backend, c.prompt_ids,
                                     {.max_new_tokens = c.max_new_tokens, .ignore_eos = true});
    EXPECT_EQ(r.token_ids, c.token_ids) << "case " << i;
    ASSERT_EQ(r.logprobs.size(), c.logprobs.size());
    for (size_t t = 0; t < c.logprobs.size(); ++t) EXPECT_NEAR(r.logprobs[t], c.logprobs[t], 1e-4) << "case " << i;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tetra
