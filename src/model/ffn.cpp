#include "model/ffn.h"

#include <string>

#include "ops/communicator.h"

namespace tetra::model {
namespace {

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

void run_mlp(ops::Backend& backend, const ops::Context& ctx, const ops::MlpWeights& w, TensorView x,
             TensorView out) {
  ops::Arena& arena = *ctx.arena;
  const int64_t n_tokens = x.dim(0), inter = w.gate.n_out;
  TensorView gate = arena.alloc(backend.activation_dtype(), {n_tokens, inter});
  TensorView up = arena.alloc(backend.activation_dtype(), {n_tokens, inter});
  backend.linear(ctx, x, w.gate, gate);
  backend.linear(ctx, x, w.up, up);
  backend.silu_mul(ctx, gate, up, gate);
  backend.linear(ctx, gate, w.down, out);
}

}  // namespace

void all_reduce(const ops::Context& ctx, TensorView x) {
  TETRA_CHECK(ctx.comm != nullptr, "a sharded model's forward needs the ranks' communicator (Context::comm)");
  ctx.comm->all_reduce_sum(ctx, x);
}

void add_rms_norm_of_parts(ops::Backend& backend, const ops::Context& ctx, bool partial, TensorView h,
                           TensorView delta, TensorView weight, float eps, TensorView out) {
  if (partial) {
    TETRA_CHECK(ctx.comm != nullptr, "a sharded model's forward needs the ranks' communicator (Context::comm)");
    if (ctx.comm->all_reduce_sum_add_rms_norm(ctx, delta, h, weight, eps, out)) return;
    ctx.comm->all_reduce_sum(ctx, delta);
  }
  backend.add_rms_norm(ctx, h, delta, weight, eps, out);
}

FfnLayer load_ffn(WeightLoader& loader, const ModelConfig& c, int layer,
                  const FfnNames& names) {
  FfnLayer ffn;
  const std::string prefix = layer_prefix(layer);
  const int64_t hidden = c.hidden_size;
  ffn.is_moe = c.layer_is_moe[size_t(layer)];
  const parallel::RankShard& shard = loader.shard();
  if (!ffn.is_moe) {
    ffn.dense = loader.mlp(prefix + "mlp.", names.gate, names.up, names.down, hidden,
                           c.intermediate_size, shard.attention());
    ffn.partial = !shard.attention().whole();
    return ffn;
  }
  const std::string moe = prefix + names.moe_prefix;
  const int64_t n_experts = c.n_routed_experts;
  ffn.router = loader.linear(moe + names.router, n_experts, hidden, false);
  ffn.routing.scoring =
      c.scoring == RouterScoring::Sigmoid ? ops::Scoring::Sigmoid : ops::Scoring::Softmax;
  ffn.routing.top_k = int(c.n_experts_per_tok);
  ffn.routing.norm_topk_prob = c.norm_topk_prob;
  ffn.routing.routed_scaling_factor = float(c.routed_scaling_factor);
  ffn.routing.n_group = int(c.n_group);
  ffn.routing.topk_group = int(c.topk_group);
  if (c.router_bias) {
    // Kept in fp32 by transformers (_keep_in_fp32_modules_strict) whatever the checkpoint
    // stores (save_pretrained of a BF16 model writes BF16): the op reads F32.
    ffn.routing.correction_bias =
        loader.floats_f32(moe + names.router + ".e_score_correction_bias", {n_experts});
  }
  const std::string shared_prefix = moe + (names.shared ? names.shared : "");
  const bool shared = c.n_shared_experts > 0 && names.shared;
  ffn.experts = loader.experts(moe + names.experts, n_experts, names.gate, names.up, names.down, hidden,
                               c.moe_intermediate_size, shared ? &shared_prefix : nullptr,
                               c.moe_intermediate_size * c.n_shared_experts,
                               {.ids = shard.expert_ids(), .width = shard.expert_width(),
                                .shared = shard.shared_expert()});
  ffn.partial = shard.world() > 1;
  return ffn;
}

void run_ffn(ops::Backend& backend, const ops::Context& ctx, const FfnLayer& ffn, TensorView x,
             TensorView out) {
  if (!ffn.is_moe) {
    run_mlp(backend, ctx, ffn.dense, x, out);
    return;
  }
  ops::Arena& arena = *ctx.arena;
  const int64_t n_tokens = x.dim(0), n_experts = ffn.router.n_out;
  const int k = ffn.routing.top_k;
  TensorView logits = arena.alloc(DType::F32, {n_tokens, n_experts});
  TensorView ids = arena.alloc(DType::I32, {n_tokens, k});
  TensorView weights = arena.alloc(DType::F32, {n_tokens, k});
  backend.linear(ctx, x, ffn.router, logits);
  backend.route(ctx, logits, ffn.routing, ids, weights);
  backend.moe_experts(ctx, x, ids, weights, *ffn.experts, out);
}

}  // namespace tetra::model
