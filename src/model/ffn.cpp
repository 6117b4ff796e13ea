#include "model/ffn.h"

#include <string>

namespace tetra::model {
namespace {

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

void run_mlp(ops::Backend& backend, const ops::MlpWeights& w, TensorView x, TensorView out) {
  const auto& ctx = backend.context();
  const int64_t n_tokens = x.dim(0), inter = w.gate.n_out;
  auto gate = backend.alloc(backend.activation_dtype(), {n_tokens, inter});
  auto up = backend.alloc(backend.activation_dtype(), {n_tokens, inter});
  backend.linear(ctx, x, w.gate, gate->view());
  backend.linear(ctx, x, w.up, up->view());
  backend.silu_mul(ctx, gate->view(), up->view(), gate->view());
  backend.linear(ctx, gate->view(), w.down, out);
}

}  // namespace

FfnLayer load_ffn(WeightLoader& loader, ops::Backend& backend, const ModelConfig& c, int layer,
                  const FfnNames& names) {
  FfnLayer ffn;
  const std::string prefix = layer_prefix(layer);
  const int64_t hidden = c.hidden_size;
  ffn.is_moe = c.layer_is_moe[size_t(layer)];
  if (!ffn.is_moe) {
    ffn.dense = loader.mlp(prefix + "mlp.", names.gate, names.up, names.down, hidden,
                           c.intermediate_size);
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
    // Kept in fp32 by transformers (_keep_in_fp32_modules_strict); the op reads F32.
    const std::string name = moe + names.router + ".e_score_correction_bias";
    ffn.routing.correction_bias = loader.floats(name, {n_experts});
    TETRA_CHECK(ffn.routing.correction_bias.dtype == DType::F32, name,
                " must be stored as F32, as transformers keeps it");
  }
  std::vector<ops::MlpWeights> experts;
  experts.reserve(size_t(n_experts));
  for (int64_t e = 0; e < n_experts; ++e)
    experts.push_back(loader.mlp(moe + names.experts + std::to_string(e) + ".", names.gate,
                                 names.up, names.down, hidden, c.moe_intermediate_size));
  ffn.experts = backend.prepare_experts(experts);
  if (c.n_shared_experts > 0 && names.shared)
    ffn.shared = loader.mlp(moe + names.shared, names.gate, names.up, names.down, hidden,
                            c.moe_intermediate_size * c.n_shared_experts);
  return ffn;
}

void run_ffn(ops::Backend& backend, const FfnLayer& ffn, TensorView x, TensorView out) {
  if (!ffn.is_moe) {
    run_mlp(backend, ffn.dense, x, out);
    return;
  }
  const auto& ctx = backend.context();
  const int64_t n_tokens = x.dim(0), n_experts = ffn.router.n_out;
  const int k = ffn.routing.top_k;
  auto logits = backend.alloc(DType::F32, {n_tokens, n_experts});
  auto ids = backend.alloc(DType::I32, {n_tokens, k});
  auto weights = backend.alloc(DType::F32, {n_tokens, k});
  backend.linear(ctx, x, ffn.router, logits->view());
  backend.route(ctx, logits->view(), ffn.routing, ids->view(), weights->view());
  backend.moe_experts(ctx, x, ids->view(), weights->view(), *ffn.experts, out);
  if (ffn.shared) {
    auto shared_out = backend.alloc(backend.activation_dtype(), out.shape);
    run_mlp(backend, *ffn.shared, x, shared_out->view());
    backend.add(ctx, out, shared_out->view(), out);
  }
}

}  // namespace tetra::model
