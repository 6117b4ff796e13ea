#include "model_summary.h"

#include "core/error.h"

namespace tetra::cli {

std::string describe_architecture(const ModelConfig& c) {
  int64_t n_dense = 0;
  for (bool moe : c.layer_is_moe) n_dense += moe ? 0 : 1;
  std::string attn;
  if (c.is_mla())
    attn = str_cat("MLA ", c.n_heads, " heads, q_lora ", c.q_lora_rank, ", kv_lora ",
                   c.kv_lora_rank, ", qk ", c.qk_nope_head_dim, "+", c.qk_rope_head_dim, ", v ",
                   c.v_head_dim, c.index_topk ? str_cat(", DSA indexer ", c.index_n_heads, "x",
                                                         c.index_head_dim, " top-", c.index_topk)
                                              : "");
  else
    attn = str_cat("GQA ", c.n_heads, "/", c.n_kv_heads, " heads x ", c.head_dim,
                   c.rope.rotary_dim < c.head_dim ? str_cat(", rotary ", c.rope.rotary_dim) : "",
                   c.qk_norm ? ", qk-norm" : "", c.attention_bias ? ", qkv bias" : "");
  const std::string router = str_cat(
      c.scoring == RouterScoring::Sigmoid ? "sigmoid" : "softmax",
      c.router_bias ? "+bias" : "", c.n_group > 1 ? str_cat(", groups ", c.topk_group, "/", c.n_group) : "",
      c.routed_scaling_factor != 1.0 ? str_cat(", scale ", c.routed_scaling_factor) : "",
      c.norm_topk_prob ? ", renormalized" : "");
  return str_cat(c.model_type, ": ", c.n_layers, " layers (", n_dense, " dense), hidden ",
                 c.hidden_size, ", ", attn, "; ", c.n_routed_experts, " experts x ",
                 c.moe_intermediate_size, ", top-", c.n_experts_per_tok,
                 c.n_shared_experts ? str_cat(" + ", c.n_shared_experts, " shared") : "", " (",
                 router, "); vocab ", c.vocab_size,
                 c.n_mtp_layers ? str_cat("; ", c.n_mtp_layers, " MTP layer(s)") : "",
                 c.hf_overrides.empty() ? "" : str_cat("; --hf-overrides ", c.hf_overrides));
}

}  // namespace tetra::cli
