// parse_model_config for each family: published configs, both spellings of each field
// (FORMATS.md §7) and transformers 5's defaults for absent fields.
#include "formats/model_config.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model_config_fixtures.h"

namespace tetra {
namespace {

using nlohmann::json;
using namespace tetra::testing;

// ---- each family parses -------------------------------------------------------------------

TEST(ModelConfig, Glm5) {
  ModelConfig c = parse(glm5());
  EXPECT_EQ(c.family, ModelFamily::GlmMoeDsa);
  EXPECT_EQ(c.vocab_size, 154880);
  EXPECT_EQ(c.n_layers, 78);
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.n_kv_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.qk_head_dim(), 256);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_TRUE(c.indexer_rope_interleaved);
  EXPECT_EQ(c.layer_has_indexer, std::vector<bool>(78, true));
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_DOUBLE_EQ(c.rope.yarn_factor, 1.0);
  EXPECT_EQ(c.scoring, RouterScoring::Sigmoid);
  EXPECT_TRUE(c.router_bias);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_experts_per_tok, 8);
  EXPECT_EQ(count_moe(c), 75);
  EXPECT_FALSE(c.layer_is_moe[2]);
  EXPECT_TRUE(c.layer_is_moe[3]);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{154820, 154827, 154829}));
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
}

TEST(ModelConfig, Glm5BothSpellingsAgree) {
  json v5 = glm5();  // as transformers 5 saves it: list form, no first_k_dense_replace
  v5.erase("first_k_dense_replace");
  v5.erase("moe_layer_freq");
  v5["mlp_layer_types"] = mlp_types(78, 3);
  v5["indexer_types"] = json(std::vector<std::string>(78, "full"));
  json old = glm5();
  old.erase("rope_parameters");
  old["rope_theta"] = 1000000;
  old["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(v5), parse(old));
}

TEST(ModelConfig, Qwen3) {
  ModelConfig c = parse(qwen3_30b());
  EXPECT_EQ(c.family, ModelFamily::Qwen3Moe);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not hidden / heads (64)
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.is_mla());
  EXPECT_EQ(c.rope.rotary_dim, 128);
  EXPECT_FALSE(c.rope.interleaved);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.scoring, RouterScoring::Softmax);
  EXPECT_FALSE(c.router_bias);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.n_shared_experts, 0);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(count_moe(c), 48);
  EXPECT_EQ(c.n_mtp_layers, 0);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_TRUE(c.layer_has_indexer.empty());
}

TEST(ModelConfig, Qwen3MlpOnlyLayersAndSparseStep) {
  json j = qwen3_30b();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  ModelConfig c = parse(j);
  // MoE where (i + 1) % 2 == 0 and i not in mlp_only_layers.
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, true, false, false, false, true}));
  json listed = j;
  listed.erase("decoder_sparse_step");
  listed.erase("mlp_only_layers");
  listed["mlp_layer_types"] = {"dense", "sparse", "dense", "dense", "dense", "sparse"};
  EXPECT_EQ(parse(listed), c);
}

TEST(ModelConfig, Mixtral) {
  ModelConfig c = parse(mixtral_8x7b());
  EXPECT_EQ(c.family, ModelFamily::Mixtral);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.n_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 14336);  // experts are intermediate_size wide
  EXPECT_EQ(c.head_dim, 128);                 // hidden / heads
  EXPECT_TRUE(c.norm_topk_prob);              // MixtralTopKRouter always renormalises
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(count_moe(c), 32);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.sliding_window, 0);
  json windowed = mixtral_8x7b();
  windowed["sliding_window"] = 4096;
  EXPECT_EQ(parse(windowed).sliding_window, 4096);
  windowed["sliding_window"] = nullptr;
  EXPECT_EQ(parse(windowed).sliding_window, 0);
  json alias = mixtral_8x7b();
  alias.erase("num_local_experts");
  alias["num_experts"] = 8;
  EXPECT_EQ(parse(alias), c);
  alias["num_local_experts"] = 4;
  EXPECT_ERROR(alias, "\"num_experts\" is 8 but \"num_local_experts\" is 4");
}

TEST(ModelConfig, Glm45PartialRope) {
  ModelConfig c = parse(glm45());
  EXPECT_EQ(c.family, ModelFamily::Glm4Moe);
  EXPECT_EQ(c.head_dim, 128);  // 5120 / 96 is not whole: head_dim is given
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_FALSE(c.rope.interleaved);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.scoring, RouterScoring::Sigmoid);
  EXPECT_TRUE(c.router_bias);
  EXPECT_EQ(count_moe(c), 89);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.bos_token_id, -1);

  json v5 = glm45();  // transformers 5 spelling
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5.erase("partial_rotary_factor");
  v5.erase("first_k_dense_replace");
  v5.erase("num_nextn_predict_layers");
  v5["num_mtp_layers"] = 1;
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000}, {"partial_rotary_factor", 0.5}};
  v5["mlp_layer_types"] = mlp_types(92, 3);
  EXPECT_EQ(parse(v5), c);
}

TEST(ModelConfig, Glm4MoeDefaultsToHalfRotary) {
  json j = glm45();
  j.erase("partial_rotary_factor");
  EXPECT_EQ(parse(j).rope.rotary_dim, 64);
  j["rope_parameters"] = {{"rope_theta", 1e6}, {"partial_rotary_factor", 1.0}};  // the dict wins
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(parse(j).rope.rotary_dim, 128);
}

TEST(ModelConfig, DeepseekV3Yarn) {
  ModelConfig c = parse(deepseek_v3());
  EXPECT_EQ(c.family, ModelFamily::DeepseekV3);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e4);
  EXPECT_DOUBLE_EQ(c.rope.yarn_factor, 40);
  EXPECT_DOUBLE_EQ(c.rope.yarn_original_max_position, 4096);
  EXPECT_DOUBLE_EQ(c.rope.yarn_beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.rope.yarn_beta_slow, 1);
  EXPECT_DOUBLE_EQ(c.rope.yarn_mscale, 1);
  EXPECT_DOUBLE_EQ(c.rope.yarn_mscale_all_dim, 1);
  EXPECT_DOUBLE_EQ(c.rope.yarn_attention_factor, 1.0);  // mscale / mscale_all_dim cancel
  EXPECT_TRUE(c.rope.yarn_truncate);
  EXPECT_EQ(count_moe(c), 58);
  EXPECT_EQ(c.n_mtp_layers, 1);

  json v5 = deepseek_v3();
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  v5.erase("first_k_dense_replace");
  v5.erase("moe_layer_freq");
  v5["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40.0},
                           {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"mscale", 1.0},
                           {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}};
  v5["mlp_layer_types"] = mlp_types(61, 3);
  EXPECT_EQ(parse(v5), c);
}

TEST(ModelConfig, KimiK2IsDeepseekV3) {
  ModelConfig c = parse(kimi_k2());
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.family, ModelFamily::DeepseekV3);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_EQ(count_moe(c), 60);
  EXPECT_EQ(c.n_mtp_layers, 0);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_DOUBLE_EQ(c.rope.theta, 50000);
  EXPECT_DOUBLE_EQ(c.rope.yarn_factor, 32);
  EXPECT_DOUBLE_EQ(c.rope.yarn_beta_fast, 1);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  // Field for field what the same file reads as under deepseek_v3.
  json as_v3 = kimi_k2();
  as_v3["model_type"] = "deepseek_v3";
  ModelConfig v3 = parse(as_v3);
  v3.model_type = "kimi_k2";
  EXPECT_EQ(v3, c);
}

TEST(ModelConfig, YarnDefaults) {
  json j = qwen3_30b();
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ModelConfig c = parse(j);
  // original_max_position_embeddings falls back to max_position_embeddings, betas to 32 / 1,
  // and without mscale the attention factor is 0.1 ln(factor) + 1.
  EXPECT_DOUBLE_EQ(c.rope.yarn_original_max_position, 131072);
  EXPECT_DOUBLE_EQ(c.rope.yarn_beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.rope.yarn_beta_slow, 1);
  EXPECT_DOUBLE_EQ(c.rope.yarn_mscale_all_dim, 0);
  EXPECT_DOUBLE_EQ(c.rope.yarn_attention_factor, 0.1 * std::log(4.0) + 1.0);

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 32768},
                       {"mscale", 0.707}, {"mscale_all_dim", 1.0}, {"truncate", false}};
  c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope.yarn_factor, 4.0);  // absent factor: max_position / original
  EXPECT_FALSE(c.rope.yarn_truncate);
  double ln4 = std::log(4.0);
  EXPECT_DOUBLE_EQ(c.rope.yarn_attention_factor, (0.1 * 0.707 * ln4 + 1) / (0.1 * ln4 + 1));

  j["rope_scaling"]["attention_factor"] = 1.25;  // explicit wins
  EXPECT_DOUBLE_EQ(parse(j).rope.yarn_attention_factor, 1.25);
}

TEST(ModelConfig, Glm47Flash) {
  ModelConfig c = parse(glm47_flash());
  EXPECT_EQ(c.family, ModelFamily::Glm4MoeLite);
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.q_lora_rank, 768);
  EXPECT_EQ(c.n_kv_heads, 20);
  EXPECT_EQ(count_moe(c), 46);
  EXPECT_FALSE(c.layer_is_moe[0]);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.8);
  EXPECT_TRUE(c.layer_has_indexer.empty());
  EXPECT_EQ(c.index_topk, 0);
}

// ---- defaults -----------------------------------------------------------------------------

TEST(ModelConfig, DefaultsPerFamily) {
  ModelConfig q = parse({{"model_type", "qwen3_moe"}});
  EXPECT_EQ(q.hidden_size, 2048);
  EXPECT_EQ(q.n_layers, 24);
  EXPECT_EQ(q.head_dim, 64);  // hidden / heads
  EXPECT_EQ(q.n_kv_heads, 4);
  EXPECT_EQ(q.n_routed_experts, 128);
  EXPECT_FALSE(q.norm_topk_prob);
  EXPECT_DOUBLE_EQ(q.rope.theta, 1e4);
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_TRUE(q.eos_token_ids.empty());
  EXPECT_EQ(q.bos_token_id, -1);

  ModelConfig m = parse({{"model_type", "mixtral"}});
  EXPECT_DOUBLE_EQ(m.rope.theta, 1e6);  // MixtralConfig.default_theta
  EXPECT_EQ(m.eos_token_ids, std::vector<int64_t>{2});

  ModelConfig d = parse({{"model_type", "deepseek_v3"}});
  EXPECT_EQ(d.q_lora_rank, 1536);
  EXPECT_EQ(d.n_group, 8);
  EXPECT_EQ(d.max_position_embeddings, 4096);
  EXPECT_EQ(count_moe(d), 58);
  EXPECT_EQ(d.n_mtp_layers, 1);
  EXPECT_TRUE(d.rope.interleaved);

  ModelConfig g = parse({{"model_type", "glm4_moe"}, {"head_dim", 128}});
  EXPECT_EQ(g.rope.rotary_dim, 64);  // partial_rotary_factor defaults to 0.5
  EXPECT_FALSE(g.qk_norm);
  EXPECT_FALSE(g.attention_bias);
  EXPECT_DOUBLE_EQ(g.routed_scaling_factor, 1.0);
  EXPECT_EQ(g.n_routed_experts, 128);
  EXPECT_EQ(count_moe(g), 45);  // first_k_dense_replace defaults to 1
  EXPECT_EQ(g.n_mtp_layers, 1);

  ModelConfig l = parse({{"model_type", "glm4_moe_lite"}});
  EXPECT_EQ(l, [] {  // GLM-4.7-Flash's sizes are the defaults
    json j = glm47_flash();
    j.erase("rope_theta");
    j.erase("num_nextn_predict_layers");
    j["eos_token_id"] = 1;
    return parse(j);
  }());

  // GLM-5's sizes are glm_moe_dsa's defaults; theta, MTP and tokens are not.
  json g5 = glm5();
  g5.erase("rope_parameters");
  g5.erase("num_nextn_predict_layers");
  g5.erase("eos_token_id");
  ModelConfig s = parse({{"model_type", "glm_moe_dsa"}});
  EXPECT_EQ(s, parse(g5));
  EXPECT_DOUBLE_EQ(s.rope.theta, 1e4);
  EXPECT_EQ(s.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_EQ(s.bos_token_id, 0);
}

TEST(ModelConfig, AbsentHeadDimAndKvHeads) {
  json j = mixtral_8x7b();
  j.erase("num_key_value_heads");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.n_kv_heads, 8);  // MixtralConfig's default, as transformers 5 fills it
  EXPECT_EQ(c.head_dim, 128);
  j["num_key_value_heads"] = nullptr;  // transformers: None means "as many as heads"
  EXPECT_EQ(parse(j).n_kv_heads, 32);
  j["head_dim"] = nullptr;
  EXPECT_EQ(parse(j).head_dim, 128);
}

TEST(ModelConfig, TokenIds) {
  json j = mixtral_8x7b();
  j["eos_token_id"] = {2, 7};
  EXPECT_EQ(parse(j).eos_token_ids, (std::vector<int64_t>{2, 7}));
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(parse(j).eos_token_ids.empty());
  j["bos_token_id"] = nullptr;
  EXPECT_EQ(parse(j).bos_token_id, -1);
}

TEST(ModelConfig, LayerPatterns) {
  json j = deepseek_v3();
  j["num_hidden_layers"] = 8;
  j["first_k_dense_replace"] = 2;
  j["moe_layer_freq"] = 3;
  // MoE where i >= 2 and i % 3 == 0.
  EXPECT_EQ(parse(j).layer_is_moe, (std::vector<bool>{false, false, false, true, false, false, true, false}));
  j["first_k_dense_replace"] = 0;
  j["moe_layer_freq"] = 1;
  EXPECT_EQ(parse(j).layer_is_moe, std::vector<bool>(8, true));
  j["mlp_layer_types"] = {"sparse", "dense", "sparse", "dense", "sparse", "sparse", "sparse", "dense"};
  EXPECT_EQ(parse(j).layer_is_moe, (std::vector<bool>{true, false, true, false, true, true, true, false}));
}

TEST(ModelConfig, DsaIndexerSharing) {
  json j = glm5();
  j["num_hidden_layers"] = 6;
  j["index_topk_pattern"] = "FSSFSF";
  ModelConfig c = parse(j);
  EXPECT_EQ(c.layer_has_indexer, (std::vector<bool>{true, false, false, true, false, true}));
  json listed = j;
  listed.erase("index_topk_pattern");
  listed["indexer_types"] = {"full", "shared", "shared", "full", "shared", "full"};
  EXPECT_EQ(parse(listed), c);
  json scheduled = j;  // GlmMoeDsaConfig: full iff max(i - offset + 1, 0) % freq == 0
  scheduled.erase("index_topk_pattern");
  scheduled["index_topk_freq"] = 2;
  scheduled["index_skip_topk_offset"] = 2;
  EXPECT_EQ(parse(scheduled).layer_has_indexer, (std::vector<bool>{true, true, false, true, false, true}));
  j["index_topk_pattern"] = "SFFFFF";
  EXPECT_ERROR(j, "marks layer 0 \"shared\"");
  j["index_topk_pattern"] = "FFF";
  EXPECT_ERROR(j, "has 3 entries for 6 layers");
}

}  // namespace
}  // namespace tetra
