#include "model/mla_moe.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "model/decoder_parts.h"
#include "model/ffn.h"
#include "model/rope.h"
#include "model/weights.h"

namespace tetra::model {
namespace {

// transformers builds q_a_layernorm, kv_a_layernorm (RMSNorm) and the indexer's k_norm
// (LayerNorm) without an eps argument in every MLA family: they use 1e-6 whatever
// rms_norm_eps says.
constexpr float kLatentNormEps = 1e-6f;

struct Indexer {
  ops::LinearWeight wq_b, wk, weights_proj;
  TensorView k_norm_weight, k_norm_bias;
};

struct MlaWeights {
  std::optional<ops::LinearWeight> q_a;  // with q_lora_rank; else q_proj
  TensorView q_a_norm;
  ops::LinearWeight q;                   // q_b_proj or q_proj
  ops::LinearWeight kv_a, kv_b, o;
  TensorView kv_a_norm;
  std::optional<Indexer> indexer;
};

struct Layer {
  TensorView input_norm, post_attention_norm;
  MlaWeights attn;
  FfnLayer ffn;
};

class MlaMoeModel : public Model {
 public:
  MlaMoeModel(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint, ops::Backend& backend,
              const LoadOptions& options)
      : config_(std::move(config)), checkpoint_(std::move(checkpoint)), backend_(backend) {
    const ModelConfig& c = config_;
    WeightLoader loader(*checkpoint_, backend_, options);
    const int64_t hidden = c.hidden_size, heads = c.n_heads;
    const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const FfnNames names{"mlp.", "gate", "experts.", "gate_proj", "up_proj", "down_proj", "shared_experts."};
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::string a = p + "self_attn.";
      Layer layer;
      layer.input_norm = loader.floats(p + "input_layernorm.weight", {hidden});
      layer.post_attention_norm = loader.floats(p + "post_attention_layernorm.weight", {hidden});
      MlaWeights& w = layer.attn;
      if (c.q_lora_rank > 0) {
        w.q_a = loader.linear(a + "q_a_proj", c.q_lora_rank, hidden, c.attention_bias);
        w.q_a_norm = loader.floats(a + "q_a_layernorm.weight", {c.q_lora_rank});
        w.q = loader.linear(a + "q_b_proj", heads * qk, c.q_lora_rank, false);
      } else {
        w.q = loader.linear(a + "q_proj", heads * qk, hidden, false);
      }
      w.kv_a = loader.linear(a + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, hidden,
                             c.attention_bias);
      w.kv_a_norm = loader.floats(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
      w.kv_b = loader.linear(a + "kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim),
                             c.kv_lora_rank, false);
      w.o = loader.linear(a + "o_proj", hidden, heads * c.v_head_dim, c.attention_bias);
      if (has_indexer(l)) {
        TETRA_CHECK(c.q_lora_rank > 0, "the DSA indexer reads the q low-rank path, but q_lora_rank is 0");
        const int64_t di = c.index_head_dim;
        Indexer ix;
        ix.wq_b = loader.linear(a + "indexer.wq_b", c.index_n_heads * di, c.q_lora_rank, false);
        ix.wk = loader.linear(a + "indexer.wk", di, hidden, false);
        ix.k_norm_weight = loader.floats(a + "indexer.k_norm.weight", {di});
        ix.k_norm_bias = loader.floats(a + "indexer.k_norm.bias", {di});
        ix.weights_proj = loader.linear(a + "indexer.weights_proj", c.index_n_heads, hidden, false);
        w.indexer = ix;
      }
      layer.ffn = load_ffn(loader, backend_, c, l, names);
      layers_.push_back(std::move(layer));
    }
    io_ = load_token_io(loader, c);
    rope_ = upload_rope(backend_, c.rope);
    index_rope_ = rope_.spec;
    index_rope_.interleaved = c.indexer_rope_interleaved;

    scale_ = 1.0 / std::sqrt(double(qk));
    if (c.rope.yarn_factor != 1.0 && c.rope.yarn_mscale_all_dim != 0) {
      const double m = yarn_mscale(c.rope.yarn_factor, c.rope.yarn_mscale_all_dim);
      scale_ *= m * m;
    }
    stats_ = loader.stats();
  }

  const ModelConfig& config() const override { return config_; }
  LoadStats load_stats() const override { return stats_; }

  std::vector<KvLayerShape> kv_layout() const override {
    std::vector<KvLayerShape> layout;
    for (int l = 0; l < config_.n_layers; ++l)
      layout.push_back({1, config_.kv_lora_rank + config_.qk_rope_head_dim, 0,
                        has_indexer(l) ? config_.index_head_dim : 0});
    return layout;
  }

  void forward(const StepInputs& in, const std::vector<ops::KvCacheLayer>& cache,
               TensorView logits) override {
    const ModelConfig& c = config_;
    ops::Backend& b = backend_;
    const auto& ctx = b.context();
    const DType act = b.activation_dtype();
    const int64_t t = in.token_ids.numel(), hidden = c.hidden_size, heads = c.n_heads;
    const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
    const int64_t rank = c.kv_lora_rank, qk = dn + dr;
    TETRA_CHECK(int64_t(cache.size()) == c.n_layers, "forward: the KV cache has ", cache.size(),
                " layers, the model ", c.n_layers);

    auto h = b.alloc(act, {t, hidden});
    auto x = b.alloc(act, {t, hidden});
    auto y = b.alloc(act, {t, hidden});
    auto q_res = b.alloc(act, {t, std::max<int64_t>(1, c.q_lora_rank)});
    auto q = b.alloc(act, {t, heads * qk});
    auto q_nope = b.alloc(act, {t, heads, dn});
    auto q_rope = b.alloc(act, {t, heads, dr});
    auto ckv = b.alloc(act, {t, rank + dr});
    auto latent = b.alloc(act, {t, rank});
    auto k_rope = b.alloc(act, {t, 1, dr});
    auto q_latent = b.alloc(act, {t, heads, rank});
    auto o_latent = b.alloc(act, {t, heads, rank});
    auto attn = b.alloc(act, {t, heads, dv});
    std::unique_ptr<ops::Buffer> selected;
    if (c.index_topk > 0) selected = b.alloc(DType::I32, {t, c.index_topk});

    b.embedding(ctx, io_.embed, in.token_ids, h->view());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const MlaWeights& w = layer.attn;
      b.rms_norm(ctx, h->view(), layer.input_norm, float(c.rms_norm_eps), x->view());
      // Queries: [nope | rope] per head.
      if (w.q_a) {
        b.linear(ctx, x->view(), *w.q_a, q_res->view());
        b.rms_norm(ctx, q_res->view(), w.q_a_norm, kLatentNormEps, q_res->view());
        b.linear(ctx, q_res->view(), w.q, q->view());
      } else {
        b.linear(ctx, x->view(), w.q, q->view());
      }
      const TensorView q_rows = q->view().reshaped({t * heads, qk});
      b.copy_columns(ctx, q_rows, 0, q_nope->view().reshaped({t * heads, dn}), 0, dn);
      b.copy_columns(ctx, q_rows, dn, q_rope->view().reshaped({t * heads, dr}), 0, dr);
      b.rope(ctx, q_rope->view(), in.attn.positions, rope_.spec);
      // The cache entry: normalized latent, then the rotated rope key.
      b.linear(ctx, x->view(), w.kv_a, ckv->view());
      b.copy_columns(ctx, ckv->view(), 0, latent->view(), 0, rank);
      b.copy_columns(ctx, ckv->view(), rank, k_rope->view().reshaped({t, dr}), 0, dr);
      b.rms_norm(ctx, latent->view(), w.kv_a_norm, kLatentNormEps, latent->view());
      b.rope(ctx, k_rope->view(), in.attn.positions, rope_.spec);
      b.copy_columns(ctx, latent->view(), 0, ckv->view(), 0, rank);
      b.copy_columns(ctx, k_rope->view().reshaped({t, dr}), 0, ckv->view(), rank, dr);
      b.cache_write(ctx, ckv->view(), in.attn, cache[l].k);

      TensorView chosen;
      if (w.indexer) {
        run_indexer(*w.indexer, x->view(), q_res->view(), in, cache[l], selected->view());
        chosen = selected->view();
      } else if (c.index_topk > 0 && l > 0) {
        chosen = selected->view();  // a "shared" layer reuses the previous full layer's choice
      }
      // Absorbed attention: q_nope through W_UK into the latent space, attend there, then
      // the latent result through W_UV.
      b.head_linear(ctx, q_nope->view(), w.kv_b, dn + dv, 0, dn, true, q_latent->view());
      b.mla_attention(ctx, q_latent->view(), q_rope->view(), cache[l], in.attn, float(scale_), chosen,
                      o_latent->view());
      b.head_linear(ctx, o_latent->view(), w.kv_b, dn + dv, dn, dv, false, attn->view());
      b.linear(ctx, attn->view().reshaped({t, heads * dv}), w.o, y->view());
      b.add(ctx, h->view(), y->view(), h->view());

      b.rms_norm(ctx, h->view(), layer.post_attention_norm, float(c.rms_norm_eps), x->view());
      run_ffn(b, layer.ffn, x->view(), y->view());
      b.add(ctx, h->view(), y->view(), h->view());
    }
    project_logits(b, io_, float(c.rms_norm_eps), h->view(), in.logit_rows, logits);
  }

 private:
  bool has_indexer(int layer) const {
    const auto& v = config_.layer_has_indexer;
    return config_.index_topk > 0 && size_t(layer) < v.size() && v[size_t(layer)];
  }

  // The DSA indexer (FORMATS.md §2.3): scores every cached key of each token's sequence and
  // keeps the best index_topk.
  void run_indexer(const Indexer& ix, TensorView x, TensorView q_res, const StepInputs& in,
                   const ops::KvCacheLayer& cache, TensorView selected) {
    const ModelConfig& c = config_;
    ops::Backend& b = backend_;
    const auto& ctx = b.context();
    const int64_t t = x.dim(0), hi = c.index_n_heads, di = c.index_head_dim;
    auto q = b.alloc(b.activation_dtype(), {t, hi, di});
    auto k = b.alloc(b.activation_dtype(), {t, 1, di});
    auto weights = b.alloc(DType::F32, {t, hi});
    b.linear(ctx, q_res, ix.wq_b, q->view().reshaped({t, hi * di}));
    b.rope(ctx, q->view(), in.attn.positions, index_rope_);
    b.linear(ctx, x, ix.wk, k->view().reshaped({t, di}));
    b.layer_norm(ctx, k->view(), ix.k_norm_weight, ix.k_norm_bias, kLatentNormEps, k->view());
    b.rope(ctx, k->view(), in.attn.positions, index_rope_);
    b.cache_write(ctx, k->view().reshaped({t, di}), in.attn, cache.index_k);
    b.linear(ctx, x, ix.weights_proj, weights->view());
    b.dsa_select(ctx, q->view(), weights->view(), cache, in.attn, float(1.0 / std::sqrt(double(di))),
                 float(1.0 / std::sqrt(double(hi))), selected);
  }

  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;  // owns the mapping the CPU weights point into
  ops::Backend& backend_;
  TokenIo io_;
  std::vector<Layer> layers_;
  DeviceRope rope_;
  ops::RopeSpec index_rope_;  // the indexer's pairing may differ; frequencies are shared
  double scale_ = 1.0;
  LoadStats stats_;
};

}  // namespace

std::unique_ptr<Model> load_mla_moe(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint,
                                    ops::Backend& backend, const LoadOptions& options) {
  return std::make_unique<MlaMoeModel>(std::move(config), std::move(checkpoint), backend, options);
}

}  // namespace tetra::model
