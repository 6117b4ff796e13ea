// A model's config.json, parsed for the families tetra serves (PRODUCT.md) and validated
// before anything is allocated. Both spellings of fields are accepted (FORMATS.md §7): the
// published ones (first_k_dense_replace, rope_theta, rope_scaling) and transformers 5's
// (mlp_layer_types, rope_parameters).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tetra {

enum class ModelFamily : uint8_t {
  Qwen3Moe,     // qwen3_moe
  Glm4Moe,      // glm4_moe
  Mixtral,      // mixtral
  DeepseekV3,   // deepseek_v3
  Glm4MoeLite,  // glm4_moe_lite
  GlmMoeDsa,    // glm_moe_dsa
};

enum class RouterScoring : uint8_t { Softmax, Sigmoid };

struct RopeConfig {
  double theta = 10000.0;
  int rotary_dim = 0;         // dims of each head that rotate (partial RoPE: < head_dim)
  bool interleaved = false;   // GPT-J pairs: MLA families' rope_interleave (default true;
                              // glm_moe_dsa always, as transformers hard-codes it)
  // YaRN (rope_type "yarn"); factor == 1 means none.
  double yarn_factor = 1.0;
  double yarn_original_max_position = 0;
  double yarn_beta_fast = 32, yarn_beta_slow = 1;
  double yarn_mscale = 1, yarn_mscale_all_dim = 0;  // mscale_all_dim 0: absent
  // Multiplies cos and sin (transformers' attention_scaling). Resolved here from
  // attention_factor, or mscale / mscale_all_dim, or 0.1 ln(factor) + 1, in transformers' order,
  // so kernels never re-derive it from the raw mscale fields. 1 without YaRN.
  double yarn_attention_factor = 1.0;
  bool yarn_truncate = true;  // floor/ceil the correction range (rope_parameters "truncate")

  bool operator==(const RopeConfig&) const = default;
};

struct ModelConfig {
  std::string model_type;
  ModelFamily family = ModelFamily::Qwen3Moe;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;             // num_hidden_layers (MTP layers not included)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;

  // Attention (GQA families). For MLA families n_kv_heads == n_heads.
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;             // q/k/v head size of GQA; MLA: qk_rope_head_dim
  bool attention_bias = false;      // q/k/v projections carry biases
  int64_t sliding_window = 0;       // Mixtral: each query sees the last N keys; 0: all keys
  bool qk_norm = false;             // RMSNorm on each q and k head (qwen3_moe; glm4_moe use_qk_norm)
  RopeConfig rope;

  // MLA (deepseek_v3, glm4_moe_lite, glm_moe_dsa); q_lora_rank 0 means q is projected directly.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // DSA indexer (glm_moe_dsa)
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;         // the first qk_rope_head_dim dims rotate, the rest pass
  int64_t index_topk = 0;
  // GPT-J pairs in the indexer's RoPE. transformers hard-codes it for glm_moe_dsa, so it is
  // always true there and a config with indexer_rope_interleave false is refused.
  bool indexer_rope_interleaved = false;
  // One entry per layer for glm_moe_dsa, empty otherwise: the layer runs its own indexer
  // ("full") or reuses the top-k of the previous full layer ("shared", GLM-5.2 indexer_types);
  // shared layers have no indexer weights and no indexer key cache.
  std::vector<bool> layer_has_indexer;

  // MLP and MoE
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each routed expert (Mixtral: intermediate_size)
  int64_t n_routed_experts = 0;
  int64_t n_experts_per_tok = 0;
  int64_t n_shared_experts = 0;       // shared expert width = n_shared * moe_intermediate
  RouterScoring scoring = RouterScoring::Softmax;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1, topk_group = 1;
  bool router_bias = false;           // e_score_correction_bias present
  std::vector<bool> layer_is_moe;     // one entry per layer: MoE (true) or dense MLP

  int64_t n_mtp_layers = 0;           // num_nextn_predict_layers, stored after the last layer

  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;

  std::string hf_overrides;  // the --hf-overrides merged into config.json, compact JSON; empty: none

  bool is_mla() const { return kv_lora_rank > 0; }
  // Field by field; two spellings of one config.json parse to equal configs.
  bool operator==(const ModelConfig&) const = default;
  int64_t qk_head_dim() const { return is_mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
};

// The model_type values tetra accepts, in the order error messages list them.
const std::vector<std::string>& supported_model_types();

// Parses and validates; `source` names the file in error messages.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
// Reads DIR/config.json, with `hf_overrides` (a JSON object's text, formats/config_overrides.h)
// merged into it first; a config the overrides make invalid is refused naming the flag.
ModelConfig load_model_config(const std::filesystem::path& dir, const std::string& hf_overrides = {});

// Sizes for `tetra inspect`.
struct ModelSizes {
  int64_t params_total = 0;    // every weight of the model, MTP layers excluded
  int64_t params_active = 0;   // those one token touches (top-k routed experts, not all)
  int64_t kv_bytes_per_token = 0;  // all layers, at `kv_dtype_bytes` per element
};
ModelSizes model_sizes(const ModelConfig& c, int kv_dtype_bytes = 2);

}  // namespace tetra
