// config.json -> ModelConfig. Defaults for absent fields are transformers 5's for each family
// (configuration_<family>.py); where transformers hard-codes a choice (Mixtral's
// renormalised top-k, qwen3_moe's qk-norm), the code says so.
#include "formats/model_config.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/config_overrides.h"
#include "formats/generation_config.h"
#include "formats/json_fields.h"

namespace tetra {
namespace {

using nlohmann::json;

// Sanity bounds: far above any published model, low enough that sizes fit in int64.
constexpr int64_t kMaxHidden = 65536;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxVocab = int64_t{4} << 20;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxIntermediate = int64_t{1} << 20;
constexpr int64_t kMaxLoraRank = 65536;
constexpr int64_t kMaxPositions = int64_t{16} << 20;
constexpr int64_t kMaxMtpLayers = 16;
constexpr int64_t kMaxSharedExperts = 64;

// transformers 5 defaults per family (the dataclass fields of configuration_<family>.py).
struct FamilyDefaults {
  const char* model_type;
  ModelFamily family;
  bool mla;
  int64_t vocab_size, hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads;
  int64_t max_position_embeddings;
  double rms_norm_eps, rope_theta, partial_rotary_factor;
  int64_t moe_intermediate_size, n_routed_experts, n_experts_per_tok, n_shared_experts;
  double routed_scaling_factor;
  int64_t n_group, topk_group, first_k_dense_replace;
  bool norm_topk_prob;
  int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  int64_t index_n_heads, index_head_dim, index_topk;
  int64_t n_mtp_layers, bos_token_id, eos_token_id;  // -1: none
};

// clang-format off
const FamilyDefaults kFamilies[] = {
  // type            family                    mla    vocab   hidden inter  layers heads kv
  {"qwen3_moe",     ModelFamily::Qwen3Moe,    false, 151936, 2048, 6144,  24, 32,  4,
   32768,  1e-6, 1e4, 1.0,  768,  128, 8, 0, 1.0, 1, 1, 0, false,
   0, 0, 0, 0, 0,  0, 0, 0,  0, -1, -1},
  {"glm4_moe",      ModelFamily::Glm4Moe,     false, 151552, 4096, 10944, 46, 96,  8,
   131072, 1e-5, 1e4, 0.5,  1408, 128, 8, 1, 1.0, 1, 1, 1, true,
   0, 0, 0, 0, 0,  0, 0, 0,  1, -1, -1},
  {"mixtral",       ModelFamily::Mixtral,     false, 32000,  4096, 14336, 32, 32,  8,
   131072, 1e-5, 1e6, 1.0,  14336, 8,  2, 0, 1.0, 1, 1, 0, true,
   0, 0, 0, 0, 0,  0, 0, 0,  0, 1, 2},
  {"deepseek_v3",   ModelFamily::DeepseekV3,  true,  129280, 7168, 18432, 61, 128, 128,
   4096,   1e-6, 1e4, 1.0,  2048, 256, 8, 1, 2.5, 8, 4, 3, true,
   1536, 512, 128, 64, 128,  0, 0, 0,  1, 0, 1},
  // Kimi K2 publishes a DeepSeek-V3 architecture under its own model_type (its remote code is
  // DeepSeek's DeepseekV3Config and modeling); its config.json sets every field itself.
  {"kimi_k2",       ModelFamily::DeepseekV3,  true,  129280, 7168, 18432, 61, 128, 128,
   4096,   1e-6, 1e4, 1.0,  2048, 256, 8, 1, 2.5, 8, 4, 3, true,
   1536, 512, 128, 64, 128,  0, 0, 0,  1, 0, 1},
  {"glm4_moe_lite", ModelFamily::Glm4MoeLite, true,  154880, 2048, 10240, 47, 20,  20,
   202752, 1e-5, 1e4, 1.0,  1536, 64,  4, 1, 1.8, 1, 1, 1, true,
   768, 512, 192, 64, 256,  0, 0, 0,  0, 0, 1},
  {"glm_moe_dsa",   ModelFamily::GlmMoeDsa,   true,  154880, 6144, 12288, 78, 64,  64,
   202752, 1e-5, 1e4, 1.0,  2048, 256, 8, 1, 2.5, 1, 1, 3, true,
   2048, 512, 192, 64, 256,  32, 128, 2048,  0, 0, 1},
};
// clang-format on

const FamilyDefaults& family_for(const JsonFields& r) {
  std::optional<std::string> type = r.maybe_string("model_type");
  std::string supported;
  for (const std::string& t : supported_model_types()) supported += (supported.empty() ? "" : ", ") + t;
  if (!type) fail(r.source(), ": \"model_type\" is missing; supported model types: ", supported, ".");
  for (const FamilyDefaults& f : kFamilies)
    if (*type == f.model_type) return f;
  fail(r.source(), ": model_type \"", *type, "\" is not supported; supported model types: ",
       supported, ".");
}

// A token id field: an integer, a list of integers, or null (none).
std::vector<int64_t> token_ids(const JsonFields& r, const std::string& key, int64_t fallback) {
  if (!r.present(key)) return fallback >= 0 ? std::vector<int64_t>{fallback} : std::vector<int64_t>{};
  const json* v = r.find(key);
  std::vector<int64_t> ids;
  if (!v) return ids;
  if (v->is_array()) {
    for (const json& e : *v) ids.push_back(r.to_integer(e, key));
  } else {
    if (!v->is_number_integer())
      r.fail_field(key, str_cat("must be an integer or a list of integers, not ", json_kind(*v)));
    ids.push_back(r.to_integer(*v, key));
  }
  for (int64_t id : ids)
    if (id < 0) r.fail_field(key, str_cat("holds ", id, "; token ids cannot be negative"));
  return ids;
}

// RoPE: transformers 5 reads rope_scaling (published configs) before rope_parameters (its own
// saved form); rope_theta and partial_rotary_factor inside the dict win over top-level ones.
RopeConfig parse_rope(const JsonFields& r, const FamilyDefaults& f, const ModelConfig& c) {
  const json* dict = r.object("rope_scaling");
  std::string dict_name = "rope_scaling";
  if (!dict || dict->empty()) dict = r.object("rope_parameters"), dict_name = "rope_parameters";
  static const json kEmpty = json::object();
  if (!dict) dict = &kEmpty;
  for (const auto& [key, value] : dict->items())
    if (value.is_object())
      r.fail_field(dict_name, str_cat("holds per-layer-type RoPE parameters (\"", key,
                                      "\"); the families tetra serves use one set"));
  JsonFields d(*dict, r.source(), dict_name + ".");

  RopeConfig rope;
  std::string type = d.maybe_string("rope_type").value_or(d.maybe_string("type").value_or("default"));
  const JsonFields& theta_from = d.has("rope_theta") ? d : r;
  rope.theta = d.maybe_number("rope_theta").value_or(r.number("rope_theta", f.rope_theta));
  if (!(rope.theta > 1.0 && std::isfinite(rope.theta)))
    theta_from.fail_field("rope_theta", str_cat("is ", rope.theta, "; it must be a finite number above 1"));

  const JsonFields& partial_from = d.has("partial_rotary_factor") ? d : r;
  double partial = d.maybe_number("partial_rotary_factor")
                       .value_or(r.number("partial_rotary_factor", f.partial_rotary_factor));
  if (!(partial > 0.0 && partial <= 1.0))
    partial_from.fail_field("partial_rotary_factor", str_cat("is ", partial, "; it must be in (0, 1]"));
  // int(head_dim * factor), as transformers computes the rotary dim.
  rope.rotary_dim = static_cast<int>(static_cast<double>(c.head_dim) * partial);
  if (rope.rotary_dim <= 0 || rope.rotary_dim % 2 != 0 || rope.rotary_dim > c.head_dim)
    partial_from.fail_field("partial_rotary_factor",
                            str_cat("gives a rotary dim of ", rope.rotary_dim, " for head dim ", c.head_dim,
                                    "; it must be even, positive and at most the head dim"));

  if (f.family == ModelFamily::GlmMoeDsa) {
    // GlmMoeDsaAttention interleaves unconditionally and never reads the flag (transformers
    // 5.17); a config asking otherwise cannot be matched, so it is refused.
    if (!r.boolean("rope_interleave", true))
      r.fail_field("rope_interleave", "is false, but glm_moe_dsa always uses interleaved RoPE");
    rope.interleaved = true;
  } else if (f.mla) {
    rope.interleaved = r.boolean("rope_interleave", true);
  }

  if (type == "default") return rope;
  if (type != "yarn")
    d.fail_field("rope_type", str_cat("is \"", type, "\"; tetra supports \"default\" and \"yarn\""));
  // YaRN fields, with transformers' fallbacks (standardize_rope_params, then
  // _compute_yarn_parameters). A top-level original_max_position_embeddings overrides the dict's.
  const JsonFields& original_from = r.has("original_max_position_embeddings") ? r : d;
  rope.yarn_original_max_position = static_cast<double>(
      original_from.maybe_integer("original_max_position_embeddings").value_or(c.max_position_embeddings));
  if (rope.yarn_original_max_position < 1)
    original_from.fail_field("original_max_position_embeddings", "must be positive");
  rope.yarn_factor = d.maybe_number("factor").value_or(
      static_cast<double>(c.max_position_embeddings) / rope.yarn_original_max_position);
  if (!(rope.yarn_factor >= 1.0 && rope.yarn_factor <= 1024.0))
    d.fail_field("factor", str_cat("is ", rope.yarn_factor, "; it must be between 1 and 1024"));
  // Python's `x or default`: 0 and null both fall back.
  rope.yarn_beta_fast = d.maybe_number("beta_fast").value_or(0.0);
  rope.yarn_beta_slow = d.maybe_number("beta_slow").value_or(0.0);
  if (rope.yarn_beta_fast == 0.0) rope.yarn_beta_fast = 32;
  if (rope.yarn_beta_slow == 0.0) rope.yarn_beta_slow = 1;
  if (!(rope.yarn_beta_fast > 0 && rope.yarn_beta_slow > 0))
    d.fail_field("beta_fast", "and beta_slow must be positive");
  std::optional<double> mscale = d.maybe_number("mscale");
  std::optional<double> mscale_all_dim = d.maybe_number("mscale_all_dim");
  rope.yarn_mscale = mscale.value_or(1.0);
  rope.yarn_mscale_all_dim = mscale_all_dim.value_or(0.0);
  rope.yarn_truncate = d.boolean("truncate", true);
  auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (std::optional<double> af = d.maybe_number("attention_factor")) {
    rope.yarn_attention_factor = *af;
  } else if (mscale.value_or(0) != 0 && mscale_all_dim.value_or(0) != 0) {
    rope.yarn_attention_factor =
        get_mscale(rope.yarn_factor, *mscale) / get_mscale(rope.yarn_factor, *mscale_all_dim);
  } else {
    rope.yarn_attention_factor = get_mscale(rope.yarn_factor, 1.0);
  }
  if (!(rope.yarn_attention_factor > 0 && std::isfinite(rope.yarn_attention_factor)))
    d.fail_field("attention_factor", "must be a positive number");
  return rope;
}

// Which layers are MoE. mlp_layer_types (transformers 5) wins over the older spellings.
std::vector<bool> parse_layer_is_moe(const JsonFields& r, const FamilyDefaults& f, int64_t n_layers) {
  std::vector<bool> moe(static_cast<size_t>(n_layers), true);
  if (const json* types = r.array("mlp_layer_types")) {
    if (static_cast<int64_t>(types->size()) != n_layers)
      r.fail_field("mlp_layer_types", str_cat("has ", types->size(), " entries for ", n_layers,
                                              " layers (num_hidden_layers)"));
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t == "sparse") continue;
      if (t != "dense")
        r.fail_field("mlp_layer_types", str_cat("entry ", i, " is ", t.dump(),
                                                "; each must be \"dense\" or \"sparse\""));
      if (f.family == ModelFamily::Mixtral)
        r.fail_field("mlp_layer_types", "marks a layer dense, but Mixtral has no dense MLP");
      moe[i] = false;
    }
    return moe;
  }
  if (f.family == ModelFamily::Mixtral) return moe;
  if (f.family == ModelFamily::Qwen3Moe) {
    // Qwen3MoeDecoderLayer: MoE unless listed in mlp_only_layers, and every step-th layer.
    int64_t step = r.integer("decoder_sparse_step", 1);
    r.check_range("decoder_sparse_step", step, 1, kMaxLayers);
    for (int64_t i = 0; i < n_layers; ++i) moe[i] = (i + 1) % step == 0;
    if (const json* only = r.array("mlp_only_layers")) {
      for (const json& e : *only) {
        int64_t i = r.to_integer(e, "mlp_only_layers");
        r.check_range("mlp_only_layers", i, 0, n_layers - 1);
        moe[i] = false;
      }
    }
    return moe;
  }
  // DeepSeek's spelling: dense before first_k_dense_replace, then MoE every moe_layer_freq-th.
  int64_t first_dense = r.integer("first_k_dense_replace", f.first_k_dense_replace);
  int64_t freq = r.integer("moe_layer_freq", 1);
  r.check_range("first_k_dense_replace", first_dense, 0, n_layers);
  r.check_range("moe_layer_freq", freq, 1, kMaxLayers);
  for (int64_t i = 0; i < n_layers; ++i) moe[i] = i >= first_dense && i % freq == 0;
  return moe;
}

// glm_moe_dsa: indexer_types, else index_topk_pattern ("FSS..."), else the freq/offset schedule
// of GlmMoeDsaConfig.__post_init__ (every layer "full" with the defaults).
std::vector<bool> parse_layer_has_indexer(const JsonFields& r, int64_t n_layers) {
  std::vector<bool> full(static_cast<size_t>(n_layers), true);
  std::vector<std::string> names;
  const char* field = "indexer_types";
  if (const json* types = r.array("indexer_types")) {
    for (const json& t : *types) {
      if (!t.is_string()) r.fail_field(field, "must hold the strings \"full\" or \"shared\"");
      names.push_back(t.get<std::string>());
    }
  } else if (r.has("index_topk_pattern")) {
    field = "index_topk_pattern";
    const json& p = *r.find(field);
    if (p.is_string()) {
      for (char ch : p.get<std::string>()) {
        if (ch != 'F' && ch != 'S') r.fail_field(field, "must be a string of 'F' and 'S'");
        names.push_back(ch == 'F' ? "full" : "shared");
      }
    } else if (p.is_array()) {
      for (const json& t : p) {
        if (!t.is_string()) r.fail_field(field, "must hold the strings \"full\" or \"shared\"");
        names.push_back(t.get<std::string>());
      }
    } else {
      r.fail_field(field, str_cat("must be a string or a list, not ", json_kind(p)));
    }
  } else {
    int64_t freq = std::max<int64_t>(r.integer("index_topk_freq", 1), 1);
    int64_t offset = r.integer("index_skip_topk_offset", 2);
    for (int64_t i = 0; i < n_layers; ++i) full[i] = std::max<int64_t>(i - offset + 1, 0) % freq == 0;
    if (n_layers > 0 && !full[0]) r.fail_field("index_skip_topk_offset", "leaves layer 0 without an indexer");
    return full;
  }
  if (static_cast<int64_t>(names.size()) != n_layers)
    r.fail_field(field, str_cat("has ", names.size(), " entries for ", n_layers, " layers"));
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != "full" && names[i] != "shared")
      r.fail_field(field, str_cat("entry ", i, " is \"", names[i], "\"; each must be \"full\" or \"shared\""));
    full[i] = names[i] == "full";
  }
  if (n_layers > 0 && !full[0])
    r.fail_field(field, "marks layer 0 \"shared\", but a shared layer reuses an earlier full layer");
  return full;
}

void parse_attention(const JsonFields& r, const FamilyDefaults& f, ModelConfig& c) {
  c.n_heads = r.integer("num_attention_heads", f.n_heads);
  r.check_range("num_attention_heads", c.n_heads, 1, kMaxHeads);
  // Absent: the family's default (transformers' dataclass field); null: one kv head per head.
  c.n_kv_heads = r.present("num_key_value_heads")
                     ? r.maybe_integer("num_key_value_heads").value_or(c.n_heads)
                     : f.n_kv_heads;
  c.attention_bias = f.family != ModelFamily::Mixtral && r.boolean("attention_bias", false);
  // MixtralAttention masks keys beyond sliding_window when it is set (null in the published
  // configs); Qwen3's variant is refused in parse_model_config.
  if (f.family == ModelFamily::Mixtral) {
    c.sliding_window = r.maybe_integer("sliding_window").value_or(0);
    if (r.has("sliding_window")) r.check_range("sliding_window", c.sliding_window, 1, kMaxPositions);
  }
  if (f.mla) {
    // MLA: every head has its own K and V from the latent, so kv heads == heads.
    c.n_kv_heads = c.n_heads;
    c.q_lora_rank = r.present("q_lora_rank") ? r.maybe_integer("q_lora_rank").value_or(0) : f.q_lora_rank;
    c.kv_lora_rank = r.integer("kv_lora_rank", f.kv_lora_rank);
    c.qk_nope_head_dim = r.integer("qk_nope_head_dim", f.qk_nope_head_dim);
    c.qk_rope_head_dim = r.integer("qk_rope_head_dim", f.qk_rope_head_dim);
    c.v_head_dim = r.integer("v_head_dim", f.v_head_dim);
    r.check_range("q_lora_rank", c.q_lora_rank, f.family == ModelFamily::GlmMoeDsa ? 1 : 0, kMaxLoraRank);
    r.check_range("kv_lora_rank", c.kv_lora_rank, 1, kMaxLoraRank);
    r.check_range("qk_nope_head_dim", c.qk_nope_head_dim, 0, kMaxHeadDim);
    r.check_range("qk_rope_head_dim", c.qk_rope_head_dim, 2, kMaxHeadDim);
    r.check_range("v_head_dim", c.v_head_dim, 1, kMaxHeadDim);
    r.check_range("qk_nope_head_dim + qk_rope_head_dim", c.qk_head_dim(), 1, kMaxHeadDim);
    // transformers points head_dim at the rope slice for MLA (the rotary embedding reads it).
    c.head_dim = c.qk_rope_head_dim;
    return;
  }
  r.check_range("num_key_value_heads", c.n_kv_heads, 1, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    r.fail_field("num_attention_heads", str_cat("is ", c.n_heads, ", not a multiple of num_key_value_heads (",
                                                c.n_kv_heads, ")"));
  if (std::optional<int64_t> hd = r.maybe_integer("head_dim")) {
    c.head_dim = *hd;
  } else {
    if (c.hidden_size % c.n_heads != 0)
      r.fail_field("head_dim", str_cat("is absent and hidden_size ", c.hidden_size,
                                       " is not a multiple of num_attention_heads ", c.n_heads));
    c.head_dim = c.hidden_size / c.n_heads;
  }
  r.check_range("head_dim", c.head_dim, 2, kMaxHeadDim);
  // qwen3_moe always normalises q and k per head; glm4_moe only with use_qk_norm.
  c.qk_norm = f.family == ModelFamily::Qwen3Moe ||
              (f.family == ModelFamily::Glm4Moe && r.boolean("use_qk_norm", false));
}

void parse_moe(const JsonFields& r, const FamilyDefaults& f, ModelConfig& c) {
  bool softmax = f.family == ModelFamily::Qwen3Moe || f.family == ModelFamily::Mixtral;
  std::optional<int64_t> experts =
      f.family == ModelFamily::Qwen3Moe  ? r.aliased_integer({"num_experts", "num_local_experts"})
      : f.family == ModelFamily::Mixtral ? r.aliased_integer({"num_local_experts", "num_experts"})
                                         : r.aliased_integer({"n_routed_experts", "num_local_experts", "num_experts"});
  c.n_routed_experts = experts.value_or(f.n_routed_experts);
  c.n_experts_per_tok = r.integer("num_experts_per_tok", f.n_experts_per_tok);
  r.check_range("n_routed_experts", c.n_routed_experts, 1, kMaxExperts);
  r.check_range("num_experts_per_tok", c.n_experts_per_tok, 1, c.n_routed_experts);
  // Mixtral's experts are intermediate_size wide; it has no separate moe size.
  c.moe_intermediate_size = f.family == ModelFamily::Mixtral
                                ? c.intermediate_size
                                : r.integer("moe_intermediate_size", f.moe_intermediate_size);
  r.check_range("moe_intermediate_size", c.moe_intermediate_size, 1, kMaxIntermediate);

  if (softmax) {
    c.scoring = RouterScoring::Softmax;
    // MixtralTopKRouter always renormalises the top-k; Qwen3 makes it optional.
    c.norm_topk_prob = f.family == ModelFamily::Mixtral || r.boolean("norm_topk_prob", f.norm_topk_prob);
    return;
  }
  c.scoring = RouterScoring::Sigmoid;
  c.router_bias = true;
  // transformers hard-codes sigmoid + noaux_tc for these families; refuse configs that ask
  // for anything else rather than run them wrongly.
  if (std::optional<std::string> s = r.maybe_string("scoring_func"); s && *s != "sigmoid")
    r.fail_field("scoring_func", str_cat("is \"", *s, "\"; this family routes with \"sigmoid\""));
  if (std::optional<std::string> s = r.maybe_string("topk_method"); s && *s != "noaux_tc")
    r.fail_field("topk_method", str_cat("is \"", *s, "\"; this family routes with \"noaux_tc\""));
  c.n_shared_experts = r.integer("n_shared_experts", f.n_shared_experts);
  r.check_range("n_shared_experts", c.n_shared_experts, 0, kMaxSharedExperts);
  c.norm_topk_prob = r.boolean("norm_topk_prob", f.norm_topk_prob);
  c.routed_scaling_factor = r.number("routed_scaling_factor", f.routed_scaling_factor);
  if (!(c.routed_scaling_factor > 0 && c.routed_scaling_factor <= 1000))
    r.fail_field("routed_scaling_factor", str_cat("is ", c.routed_scaling_factor, "; it must be in (0, 1000]"));
  c.n_group = r.integer("n_group", f.n_group);
  c.topk_group = r.integer("topk_group", f.topk_group);
  r.check_range("n_group", c.n_group, 1, c.n_routed_experts);
  if (c.n_routed_experts % c.n_group != 0)
    r.fail_field("n_group", str_cat("is ", c.n_group, ", which does not divide n_routed_experts (",
                                    c.n_routed_experts, ")"));
  r.check_range("topk_group", c.topk_group, 1, c.n_group);
  // The group score sums each group's top-2, and the kept groups must hold k experts.
  int64_t per_group = c.n_routed_experts / c.n_group;
  if (per_group < 2)
    r.fail_field("n_group", str_cat("leaves ", per_group, " expert per group; the group score needs 2"));
  if (c.n_experts_per_tok > c.topk_group * per_group)
    r.fail_field("num_experts_per_tok", str_cat("is ", c.n_experts_per_tok, ", more than the ",
                                                c.topk_group * per_group, " experts in topk_group groups"));
}

// Sums products of sizes, failing rather than wrapping on overflow.
class ParamCount {
 public:
  ParamCount& add(std::initializer_list<int64_t> factors) {
    int64_t product = 1;
    for (int64_t f : factors)
      if (__builtin_mul_overflow(product, f, &product)) overflow();
    if (__builtin_add_overflow(total_, product, &total_)) overflow();
    return *this;
  }
  int64_t total() const { return total_; }

 private:
  [[noreturn]] static void overflow() { fail("model_sizes: the parameter count overflows 64 bits."); }
  int64_t total_ = 0;
};

// One layer's attention weights, norms included (the two layer norms are counted elsewhere).
void add_attention(const ModelConfig& c, bool has_indexer, ParamCount& n) {
  const int64_t h = c.hidden_size, bias = c.attention_bias ? 1 : 0;
  if (!c.is_mla()) {
    const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
    n.add({h, q + 2 * kv}).add({bias, q + 2 * kv});
    n.add({q, h});
    // Qwen3 puts the bias on o_proj too; GLM-4.5 keeps o_proj bias-free.
    if (c.family == ModelFamily::Qwen3Moe) n.add({bias, h});
    if (c.qk_norm) n.add({2, c.head_dim});
    return;
  }
  const int64_t qk = c.n_heads * c.qk_head_dim();
  if (c.q_lora_rank > 0) {
    n.add({h, c.q_lora_rank}).add({bias, c.q_lora_rank});  // q_a_proj
    n.add({c.q_lora_rank});                                // q_a_layernorm
    n.add({c.q_lora_rank, qk});                            // q_b_proj
  } else {
    n.add({h, qk});  // q_proj
  }
  const int64_t kv_a = c.kv_lora_rank + c.qk_rope_head_dim;
  n.add({h, kv_a}).add({bias, kv_a});                                      // kv_a_proj_with_mqa
  n.add({c.kv_lora_rank});                                                 // kv_a_layernorm
  n.add({c.kv_lora_rank, c.n_heads, c.qk_nope_head_dim + c.v_head_dim});  // kv_b_proj
  n.add({c.n_heads, c.v_head_dim, h}).add({bias, h});                      // o_proj
  if (has_indexer) {
    n.add({c.q_lora_rank, c.index_n_heads, c.index_head_dim});  // wq_b
    n.add({h, c.index_head_dim});                               // wk
    n.add({2, c.index_head_dim});                               // k_norm (LayerNorm: weight, bias)
    n.add({h, c.index_n_heads});                                // weights_proj
  }
}

}  // namespace

ModelSizes model_sizes(const ModelConfig& c, int kv_dtype_bytes) {
  TETRA_CHECK(kv_dtype_bytes >= 1 && kv_dtype_bytes <= 8,
              "model_sizes: kv_dtype_bytes is ", kv_dtype_bytes, "; it must be between 1 and 8.");
  TETRA_CHECK(static_cast<int64_t>(c.layer_is_moe.size()) == c.n_layers,
              "model_sizes: layer_is_moe has ", c.layer_is_moe.size(), " entries for ", c.n_layers, " layers.");
  const int64_t h = c.hidden_size;
  ParamCount shared;  // weights every token uses
  ParamCount routed_all, routed_active;
  shared.add({c.vocab_size, h});                               // embed_tokens
  if (!c.tie_word_embeddings) shared.add({c.vocab_size, h});  // lm_head
  shared.add({h});                                             // final norm
  int64_t n_indexer_layers = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    bool indexer = !c.layer_has_indexer.empty() && c.layer_has_indexer[l];
    n_indexer_layers += indexer;
    add_attention(c, indexer, shared);
    shared.add({2, h});  // input_layernorm, post_attention_layernorm
    if (!c.layer_is_moe[l]) {
      shared.add({3, h, c.intermediate_size});  // gate, up, down
      continue;
    }
    const int64_t expert = 3 * h * c.moe_intermediate_size;
    routed_all.add({c.n_routed_experts, expert});
    routed_active.add({c.n_experts_per_tok, expert});
    shared.add({c.n_shared_experts, expert});        // shared experts: n_shared * moe_inter wide
    shared.add({c.n_routed_experts, h});             // router
    if (c.router_bias) shared.add({c.n_routed_experts});  // e_score_correction_bias
  }
  ModelSizes s;
  s.params_total = ParamCount().add({shared.total()}).add({routed_all.total()}).total();
  s.params_active = ParamCount().add({shared.total()}).add({routed_active.total()}).total();
  ParamCount kv;
  if (c.is_mla()) {
    // MLA caches the normalised latent and the shared rope key, not per-head K/V.
    kv.add({c.n_layers, c.kv_lora_rank + c.qk_rope_head_dim, kv_dtype_bytes});
    kv.add({n_indexer_layers, c.index_head_dim, kv_dtype_bytes});  // DSA indexer keys
  } else {
    kv.add({c.n_layers, 2, c.n_kv_heads, c.head_dim, kv_dtype_bytes});
  }
  s.kv_bytes_per_token = kv.total();
  return s;
}

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> t;
    for (const FamilyDefaults& f : kFamilies) t.push_back(f.model_type);
    return t;
  }();
  return types;
}

ModelConfig parse_model_config(const json& j, const std::string& source) {
  if (!j.is_object()) fail(source, ": the config must be a JSON object, not ", json_kind(j), ".");
  JsonFields r(j, source);
  const FamilyDefaults& f = family_for(r);
  ModelConfig c;
  c.model_type = f.model_type;
  c.family = f.family;

  if (std::optional<std::string> act = r.maybe_string("hidden_act"); act && *act != "silu")
    r.fail_field("hidden_act", str_cat("is \"", *act, "\"; these families use \"silu\""));
  if (r.boolean("use_sliding_window", false))
    r.fail_field("use_sliding_window", "is true; tetra does not implement sliding-window attention");

  c.vocab_size = r.integer("vocab_size", f.vocab_size);
  c.hidden_size = r.integer("hidden_size", f.hidden_size);
  c.n_layers = r.integer("num_hidden_layers", f.n_layers);
  c.intermediate_size = r.integer("intermediate_size", f.intermediate_size);
  c.max_position_embeddings = r.integer("max_position_embeddings", f.max_position_embeddings);
  r.check_range("vocab_size", c.vocab_size, 1, kMaxVocab);
  r.check_range("hidden_size", c.hidden_size, 1, kMaxHidden);
  r.check_range("num_hidden_layers", c.n_layers, 1, kMaxLayers);
  r.check_range("intermediate_size", c.intermediate_size, 1, kMaxIntermediate);
  r.check_range("max_position_embeddings", c.max_position_embeddings, 1, kMaxPositions);
  c.rms_norm_eps = r.number("rms_norm_eps", f.rms_norm_eps);
  if (!(c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0))
    r.fail_field("rms_norm_eps", str_cat("is ", c.rms_norm_eps, "; it must be in (0, 1)"));
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);

  parse_attention(r, f, c);
  c.rope = parse_rope(r, f, c);
  parse_moe(r, f, c);
  c.layer_is_moe = parse_layer_is_moe(r, f, c.n_layers);

  if (f.family == ModelFamily::GlmMoeDsa) {
    c.index_n_heads = r.integer("index_n_heads", f.index_n_heads);
    c.index_head_dim = r.integer("index_head_dim", f.index_head_dim);
    c.index_topk = r.integer("index_topk", f.index_topk);
    r.check_range("index_n_heads", c.index_n_heads, 1, kMaxHeads);
    // The indexer rotates its first qk_rope_head_dim dims and passes the rest.
    r.check_range("index_head_dim", c.index_head_dim, c.qk_rope_head_dim, kMaxHeadDim);
    r.check_range("index_topk", c.index_topk, 1, kMaxPositions);
    // GlmMoeDsaIndexer interleaves unconditionally, as the attention does.
    if (!r.boolean("indexer_rope_interleave", true))
      r.fail_field("indexer_rope_interleave", "is false, but glm_moe_dsa's indexer always uses interleaved RoPE");
    c.indexer_rope_interleaved = true;
    c.layer_has_indexer = parse_layer_has_indexer(r, c.n_layers);
  }

  c.n_mtp_layers = r.aliased_integer({"num_nextn_predict_layers", "num_mtp_layers"}).value_or(f.n_mtp_layers);
  r.check_range("num_nextn_predict_layers", c.n_mtp_layers, 0, kMaxMtpLayers);
  c.eos_token_ids = token_ids(r, "eos_token_id", f.eos_token_id);
  std::vector<int64_t> bos = token_ids(r, "bos_token_id", f.bos_token_id);
  if (bos.size() > 1) r.fail_field("bos_token_id", "must be a single integer");
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  for (int64_t id : c.eos_token_ids)
    if (id >= c.vocab_size) r.fail_field("eos_token_id", str_cat("holds ", id, ", outside the vocabulary of ", c.vocab_size));
  if (c.bos_token_id >= c.vocab_size)
    r.fail_field("bos_token_id", str_cat("is ", c.bos_token_id, ", outside the vocabulary of ", c.vocab_size));

  model_sizes(c);  // the bounds above keep every size within int64; this confirms it
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir, const std::string& hf_overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) fail("model folder ", dir.string(), " does not exist.");
  if (!std::filesystem::is_directory(dir, ec))
    fail(dir.string(), " is not a folder; pass the model folder that holds config.json.");
  std::filesystem::path path = dir / "config.json";
  if (!std::filesystem::is_regular_file(path, ec))
    fail("model folder ", dir.string(), " has no config.json.");
  const json overrides = parse_config_overrides(hf_overrides);
  json file = read_json_file(path, "model config");
  std::string source = path.string();
  if (!overrides.empty()) {
    if (!file.is_object()) fail(source, ": the config must be a JSON object, not ", json_kind(file), ".");
    apply_config_overrides(file, overrides);
    source += " with --hf-overrides";
  }
  ModelConfig c = parse_model_config(file, source);
  if (!overrides.empty()) c.hf_overrides = overrides.dump();
  // Generation stops at generation_config.json's EOS ids too, as transformers and vLLM stop:
  // Qwen3 lists <|im_end|> and <|endoftext|> there, config.json only one of them.
  if (auto g = load_generation_config(dir, c.vocab_size))
    for (int64_t id : g->eos_token_ids)
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
  return c;
}

}  // namespace tetra
