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
  MlaMoeModel(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint, const std::filesystem::path& dir,
              ops::Backend& backend, const LoadOptions& options)
      : config_(std::move(config)), checkpoint_(std::move(checkpoint)), backend_(backend) {
    const ModelConfig& c = config_;
    WeightLoader loader(checkpoint_.get(), dir, backend_, options);
    const int64_t hidden = c.hidden_size, heads = c.n_heads;
    const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const FfnNames names{"mlp.", "gate", "experts.", "gate_proj", "up_proj", "down_proj", "shared_experts."};
    // Under tensor parallelism a rank holds its heads' rows of q_b_proj (q_proj) and kv_b_proj
    // and their columns of o_proj (bias on rank 0 alone). The latent path (q_a, kv_a, their
    // norms) and the DSA indexer stay whole on every rank: the latent cache is replicated.
    const parallel::Part tp = options.shard.attention();
    const parallel::HeadShard hs = parallel::split_heads(heads, heads, tp);
    heads_ = hs.n_q;
    const auto head_rows = [&](int64_t per_head) {
      return tp.whole() ? LinearSlice{} : LinearSlice::rows({hs.q_begin * per_head, (hs.q_begin + hs.n_q) * per_head});
    };
    const int64_t dv = c.v_head_dim;
    const LinearSlice o_columns =
        tp.whole() ? LinearSlice{} : LinearSlice::columns({hs.q_begin * dv, (hs.q_begin + hs.n_q) * dv}, tp.index == 0);
    attention_partial_ = !tp.whole();
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
        w.q = loader.linear(a + "q_b_proj", heads * qk, c.q_lora_rank, false, head_rows(qk));
      } else {
        w.q = loader.linear(a + "q_proj", heads * qk, hidden, false, head_rows(qk));
      }
      w.kv_a = loader.linear(a + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, hidden,
                             c.attention_bias);
      w.kv_a_norm = loader.floats(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
      w.kv_b = loader.linear(a + "kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim),
                             c.kv_lora_rank, false, head_rows(c.qk_nope_head_dim + c.v_head_dim));
      w.o = loader.linear(a + "o_proj", hidden, heads * c.v_head_dim, c.attention_bias, o_columns);
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
      layer.ffn = load_ffn(loader, c, l, names);
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
    storage_ = loader.take_storage();
    backend_.synchronize();  // queued uploads read the mapping and the loader's buffers
  }

  const ModelConfig& config() const override { return config_; }
  LoadStats load_stats() const override { return stats_; }
  std::vector<const ops::MoeExperts*> moe_experts() const override {
    std::vector<const ops::MoeExperts*> out;
    for (const Layer& l : layers_)
      if (l.ffn.experts) out.push_back(l.ffn.experts.get());
    return out;
  }

  std::vector<KvLayerShape> kv_layout() const override {
    std::vector<KvLayerShape> layout;
    for (int l = 0; l < config_.n_layers; ++l)
      layout.push_back({1, config_.kv_lora_rank + config_.qk_rope_head_dim, 0,
                        has_indexer(l) ? config_.index_head_dim : 0});
    return layout;
  }

  void forward(const ops::Context& ctx, const StepInputs& in,
               const std::vector<ops::KvCacheLayer>& cache, TensorView logits) override {
    const ModelConfig& c = config_;
    ops::Backend& b = backend_;
    ops::Arena& arena = *ctx.arena;
    const DType act = b.activation_dtype();
    const int64_t t = in.token_ids.numel(), hidden = c.hidden_size, heads = heads_;  // this rank's
    const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
    const int64_t rank = c.kv_lora_rank, qk = dn + dr;
    TETRA_CHECK(int64_t(cache.size()) == c.n_layers, "forward: the KV cache has ", cache.size(),
                " layers, the model ", c.n_layers);

    TensorView h = arena.alloc(act, {t, hidden});
    TensorView x = arena.alloc(act, {t, hidden});
    TensorView y = arena.alloc(act, {t, hidden});
    TensorView q_res = arena.alloc(act, {t, std::max<int64_t>(1, c.q_lora_rank)});
    TensorView q = arena.alloc(act, {t, heads * qk});
    TensorView q_nope = arena.alloc(act, {t, heads, dn});
    TensorView q_rope = arena.alloc(act, {t, heads, dr});
    TensorView ckv = arena.alloc(act, {t, rank + dr});
    TensorView q_latent = arena.alloc(act, {t, heads, rank});
    TensorView o_latent = arena.alloc(act, {t, heads, rank});
    TensorView attn = arena.alloc(act, {t, heads, dv});
    TensorView selected;
    if (c.index_topk > 0) selected = arena.alloc(DType::I32, {t, c.index_topk});

    b.embedding(ctx, io_.embed, in.token_ids, h);
    b.rms_norm(ctx, h, layers_.front().input_norm, float(c.rms_norm_eps), x);
    const int64_t layer_scratch = arena.mark();  // each layer's ops' scratch is freed after it
    for (size_t l = 0; l < layers_.size(); ++l) {
      arena.rewind(layer_scratch);
      const Layer& layer = layers_[l];
      const MlaWeights& w = layer.attn;
      // x holds rms_norm(h) with this layer's input norm.
      // Queries: [nope | rope] per head.
      if (w.q_a) {
        b.linear(ctx, x, *w.q_a, q_res);
        b.rms_norm(ctx, q_res, w.q_a_norm, kLatentNormEps, q_res);
        b.linear(ctx, q_res, w.q, q);
      } else {
        b.linear(ctx, x, w.q, q);
      }
      // q as [nope | rotated rope] halves; the cache entry as the normalized latent, then the
      // rotated rope key.
      b.linear(ctx, x, w.kv_a, ckv);
      b.mla_rope_cache_write(ctx, q.reshaped({t, heads, qk}), q_nope, q_rope, ckv, w.kv_a_norm, kLatentNormEps,
                             rope_.spec, in.attn, cache[l].k);

      TensorView chosen;
      if (w.indexer) {
        run_indexer(ctx, *w.indexer, x, q_res, in, cache[l], selected);
        chosen = selected;
      } else if (c.index_topk > 0 && l > 0) {
        chosen = selected;  // a "shared" layer reuses the previous full layer's choice
      }
      // Absorbed attention: q_nope through W_UK into the latent space, attend there, then
      // the latent result through W_UV.
      b.head_linear(ctx, q_nope, w.kv_b, dn + dv, 0, dn, true, q_latent);
      b.mla_attention(ctx, q_latent, q_rope, cache[l], in.attn, float(scale_), chosen,
                      o_latent);
      b.head_linear(ctx, o_latent, w.kv_b, dn + dv, dn, dv, false, attn);
      b.linear(ctx, attn.reshaped({t, heads * dv}), w.o, y);
      add_rms_norm_of_parts(b, ctx, attention_partial_, h, y, layer.post_attention_norm, float(c.rms_norm_eps), x);
      run_ffn(b, ctx, layer.ffn, x, y);
      if (l + 1 < layers_.size()) {
        add_rms_norm_of_parts(b, ctx, layer.ffn.partial, h, y, layers_[l + 1].input_norm, float(c.rms_norm_eps), x);
      } else {
        if (layer.ffn.partial) all_reduce(ctx, y);
        b.add(ctx, h, y, h);
      }
    }
    if (!logits.empty()) project_logits(b, ctx, io_, float(c.rms_norm_eps), h, in.logit_rows, logits);
  }

 private:
  bool has_indexer(int layer) const {
    const auto& v = config_.layer_has_indexer;
    return config_.index_topk > 0 && size_t(layer) < v.size() && v[size_t(layer)];
  }

  // The DSA indexer (FORMATS.md §2.3): scores every cached key of each token's sequence and
  // keeps the best index_topk.
  void run_indexer(const ops::Context& ctx, const Indexer& ix, TensorView x, TensorView q_res,
                   const StepInputs& in, const ops::KvCacheLayer& cache, TensorView selected) {
    const ModelConfig& c = config_;
    ops::Backend& b = backend_;
    ops::Arena& arena = *ctx.arena;
    const int64_t t = x.dim(0), hi = c.index_n_heads, di = c.index_head_dim;
    TensorView q = arena.alloc(b.activation_dtype(), {t, hi, di});
    TensorView k = arena.alloc(b.activation_dtype(), {t, 1, di});
    TensorView weights = arena.alloc(DType::F32, {t, hi});
    b.linear(ctx, q_res, ix.wq_b, q.reshaped({t, hi * di}));
    b.rope(ctx, q, in.attn.positions, index_rope_);
    b.linear(ctx, x, ix.wk, k.reshaped({t, di}));
    b.layer_norm(ctx, k, ix.k_norm_weight, ix.k_norm_bias, kLatentNormEps, k);
    b.rope(ctx, k, in.attn.positions, index_rope_);
    b.cache_write(ctx, k.reshaped({t, di}), in.attn, cache.index_k);
    b.linear(ctx, x, ix.weights_proj, weights);
    b.dsa_select(ctx, q, weights, cache, in.attn, float(1.0 / std::sqrt(double(di))),
                 float(1.0 / std::sqrt(double(hi))), selected);
  }

  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;  // owns the mapping the CPU weights point into (null: dummy)
  std::vector<std::unique_ptr<ops::Buffer>> storage_;  // weights the backend does not own
  ops::Backend& backend_;
  TokenIo io_;
  std::vector<Layer> layers_;
  DeviceRope rope_;
  ops::RopeSpec index_rope_;  // the indexer's pairing may differ; frequencies are shared
  double scale_ = 1.0;
  LoadStats stats_;
  int64_t heads_ = 0;               // this rank's attention heads
  bool attention_partial_ = false;  // o_proj's output is this rank's part of the sum
};

}  // namespace

std::unique_ptr<Model> load_mla_moe(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint,
                                    const std::filesystem::path& dir, ops::Backend& backend,
                                    const LoadOptions& options) {
  return std::make_unique<MlaMoeModel>(std::move(config), std::move(checkpoint), dir, backend, options);
}

}  // namespace tetra::model
