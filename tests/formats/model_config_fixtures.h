// Published configs (FORMATS.md §1.1, §1.4) as JSON, and helpers shared by the
// model_config tests.
#pragma once

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/model_config.h"

namespace tetra::testing {

using nlohmann::json;

inline ModelConfig parse(const json& j) { return parse_model_config(j, "config.json"); }

// The message of the tetra::Error that parsing `j` throws ("" if none).
inline std::string error_of(const json& j) {
  try {
    parse(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(j, text)                                       \
  do {                                                              \
    std::string message = error_of(j);                              \
    EXPECT_NE(message.find(text), std::string::npos)                \
        << "expected an error containing \"" << (text) << "\", got \"" << message << "\""; \
  } while (0)

// zai-org/GLM-5 as published (FORMATS.md §1.1), in the older spellings.
inline json glm5() {
  return {{"architectures", {"GlmMoeDsaForCausalLM"}}, {"model_type", "glm_moe_dsa"},
          {"hidden_size", 6144}, {"num_hidden_layers", 78}, {"first_k_dense_replace", 3},
          {"moe_layer_freq", 1}, {"intermediate_size", 12288}, {"n_routed_experts", 256},
          {"n_shared_experts", 1}, {"num_experts_per_tok", 8}, {"moe_intermediate_size", 2048},
          {"num_attention_heads", 64}, {"num_key_value_heads", 64}, {"q_lora_rank", 2048},
          {"kv_lora_rank", 512}, {"qk_nope_head_dim", 192}, {"qk_rope_head_dim", 64},
          {"v_head_dim", 256}, {"head_dim", 64}, {"attention_bias", false},
          {"index_n_heads", 32}, {"index_head_dim", 128}, {"index_topk", 2048},
          {"indexer_rope_interleave", true}, {"scoring_func", "sigmoid"},
          {"topk_method", "noaux_tc"}, {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5},
          {"n_group", 1}, {"topk_group", 1},
          {"rope_parameters", {{"rope_theta", 1000000}, {"rope_type", "default"}}},
          {"rope_interleave", true}, {"max_position_embeddings", 202752},
          {"rms_norm_eps", 1e-5}, {"hidden_act", "silu"}, {"vocab_size", 154880},
          {"tie_word_embeddings", false}, {"pad_token_id", 154820},
          {"eos_token_id", {154820, 154827, 154829}}, {"num_nextn_predict_layers", 1},
          {"ep_size", 1}, {"pretraining_tp", 1}, {"dtype", "bfloat16"}};
}

inline json qwen3_30b() {  // Qwen/Qwen3-30B-A3B
  return {{"model_type", "qwen3_moe"}, {"hidden_size", 2048}, {"num_hidden_layers", 48},
          {"num_attention_heads", 32}, {"num_key_value_heads", 4}, {"head_dim", 128},
          {"intermediate_size", 6144}, {"moe_intermediate_size", 768}, {"num_experts", 128},
          {"num_experts_per_tok", 8}, {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()}, {"rope_theta", 1000000.0}, {"rope_scaling", nullptr},
          {"max_position_embeddings", 40960}, {"rms_norm_eps", 1e-6}, {"vocab_size", 151936},
          {"tie_word_embeddings", false}, {"use_sliding_window", false}, {"sliding_window", nullptr},
          {"attention_bias", false}, {"bos_token_id", 151643}, {"eos_token_id", 151645}};
}

inline json mixtral_8x7b() {
  return {{"model_type", "mixtral"}, {"hidden_size", 4096}, {"num_hidden_layers", 32},
          {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"intermediate_size", 14336},
          {"num_local_experts", 8}, {"num_experts_per_tok", 2}, {"rope_theta", 1e6},
          {"max_position_embeddings", 32768}, {"rms_norm_eps", 1e-5}, {"vocab_size", 32000},
          {"tie_word_embeddings", false}, {"bos_token_id", 1}, {"eos_token_id", 2}};
}

inline json deepseek_v3() {  // deepseek-ai/DeepSeek-V3
  return {{"model_type", "deepseek_v3"}, {"hidden_size", 7168}, {"num_hidden_layers", 61},
          {"first_k_dense_replace", 3}, {"moe_layer_freq", 1}, {"intermediate_size", 18432},
          {"moe_intermediate_size", 2048}, {"n_routed_experts", 256}, {"n_shared_experts", 1},
          {"num_experts_per_tok", 8}, {"num_attention_heads", 128}, {"num_key_value_heads", 128},
          {"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
          {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"n_group", 8}, {"topk_group", 4},
          {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
          {"topk_method", "noaux_tc"}, {"rope_theta", 10000},
          {"rope_scaling", {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 1.0},
                            {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096},
                            {"type", "yarn"}}},
          {"max_position_embeddings", 163840}, {"rms_norm_eps", 1e-6}, {"vocab_size", 129280},
          {"tie_word_embeddings", false}, {"bos_token_id", 0}, {"eos_token_id", 1},
          {"num_nextn_predict_layers", 1}};
}

inline json kimi_k2() {  // moonshotai/Kimi-K2-Instruct, as published (FP8 block quantization left out)
  return {{"architectures", {"DeepseekV3ForCausalLM"}}, {"attention_bias", false}, {"attention_dropout", 0.0},
          {"auto_map", {{"AutoConfig", "configuration_deepseek.DeepseekV3Config"},
                        {"AutoModel", "modeling_deepseek.DeepseekV3Model"},
                        {"AutoModelForCausalLM", "modeling_deepseek.DeepseekV3ForCausalLM"}}},
          {"aux_loss_alpha", 0.001}, {"bos_token_id", 163584}, {"eos_token_id", 163585},
          {"first_k_dense_replace", 1}, {"hidden_act", "silu"}, {"hidden_size", 7168},
          {"initializer_range", 0.02}, {"intermediate_size", 18432}, {"kv_lora_rank", 512},
          {"max_position_embeddings", 131072}, {"model_type", "kimi_k2"}, {"moe_intermediate_size", 2048},
          {"moe_layer_freq", 1}, {"n_group", 1}, {"n_routed_experts", 384}, {"n_shared_experts", 1},
          {"norm_topk_prob", true}, {"num_attention_heads", 64}, {"num_experts_per_tok", 8},
          {"num_hidden_layers", 61}, {"num_key_value_heads", 64}, {"num_nextn_predict_layers", 0},
          {"pretraining_tp", 1}, {"q_lora_rank", 1536}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_scaling", {{"beta_fast", 1.0}, {"beta_slow", 1.0}, {"factor", 32.0}, {"mscale", 1.0},
                            {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096},
                            {"type", "yarn"}}},
          {"rope_theta", 50000.0}, {"routed_scaling_factor", 2.827}, {"scoring_func", "sigmoid"},
          {"seq_aux", true}, {"tie_word_embeddings", false}, {"topk_group", 1}, {"topk_method", "noaux_tc"},
          {"torch_dtype", "bfloat16"}, {"transformers_version", "4.48.3"}, {"use_cache", true},
          {"v_head_dim", 128}, {"vocab_size", 163840}};
}

inline json glm45() {  // zai-org/GLM-4.5 (355B-A32B)
  return {{"model_type", "glm4_moe"}, {"hidden_size", 5120}, {"num_hidden_layers", 92},
          {"first_k_dense_replace", 3}, {"intermediate_size", 12288},
          {"moe_intermediate_size", 1536}, {"n_routed_experts", 160}, {"n_shared_experts", 1},
          {"num_experts_per_tok", 8}, {"num_attention_heads", 96}, {"num_key_value_heads", 8},
          {"head_dim", 128}, {"partial_rotary_factor", 0.5}, {"attention_bias", true},
          {"use_qk_norm", true}, {"n_group", 1}, {"topk_group", 1}, {"norm_topk_prob", true},
          {"routed_scaling_factor", 2.5}, {"rope_theta", 1000000}, {"rope_scaling", nullptr},
          {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-5}, {"vocab_size", 151552},
          {"tie_word_embeddings", false}, {"eos_token_id", {151329, 151336, 151338}},
          {"pad_token_id", 151329}, {"num_nextn_predict_layers", 1}};
}

inline json glm47_flash() {  // zai-org/GLM-4.7-Flash
  return {{"model_type", "glm4_moe_lite"}, {"hidden_size", 2048}, {"num_hidden_layers", 47},
          {"first_k_dense_replace", 1}, {"intermediate_size", 10240},
          {"moe_intermediate_size", 1536}, {"n_routed_experts", 64}, {"n_shared_experts", 1},
          {"num_experts_per_tok", 4}, {"num_attention_heads", 20}, {"num_key_value_heads", 20},
          {"q_lora_rank", 768}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 192},
          {"qk_rope_head_dim", 64}, {"v_head_dim", 256}, {"routed_scaling_factor", 1.8},
          {"n_group", 1}, {"topk_group", 1}, {"norm_topk_prob", true}, {"rope_theta", 1000000},
          {"rope_interleave", true}, {"max_position_embeddings", 202752}, {"rms_norm_eps", 1e-5},
          {"vocab_size", 154880}, {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 1},
          {"eos_token_id", {154820, 154827, 154829}}};
}

// transformers 5's list form of first_k_dense replace.
inline json mlp_types(int64_t n_layers, int64_t n_dense) {
  json t = json::array();
  for (int64_t i = 0; i < n_layers; ++i) t.push_back(i < n_dense ? "dense" : "sparse");
  return t;
}

inline int count_moe(const ModelConfig& c) {
  int n = 0;
  for (bool moe : c.layer_is_moe) n += moe;
  return n;
}

}  // namespace tetra::testing
