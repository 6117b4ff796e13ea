#include "model/gqa_moe.h"

#include <cmath>
#include <string>
#include <vector>

#include "model/decoder_parts.h"
#include "model/ffn.h"
#include "model/rope.h"
#include "model/weights.h"

namespace tetra::model {
namespace {

struct AttentionWeights {
  ops::LinearWeight q, k, v, o;
  TensorView q_norm, k_norm;  // per-head RMSNorm weights [head_dim] (qk-norm families)
};

struct Layer {
  TensorView input_norm, post_attention_norm;
  AttentionWeights attn;
  float k_scale = 1.0f, v_scale = 1.0f;  // an FP8 KV cache's scales (KvLayerShape)
  FfnLayer ffn;
};

FfnNames ffn_names(ModelFamily family) {
  if (family == ModelFamily::Mixtral)
    return {"block_sparse_moe.", "gate", "experts.", "w1", "w3", "w2", nullptr};
  return {"mlp.", "gate", "experts.", "gate_proj", "up_proj", "down_proj", "shared_experts."};
}

class GqaMoeModel : public Model {
 public:
  GqaMoeModel(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint, const std::filesystem::path& dir,
              ops::Backend& backend, const LoadOptions& options)
      : config_(std::move(config)), checkpoint_(std::move(checkpoint)), backend_(backend) {
    const ModelConfig& c = config_;
    WeightLoader loader(checkpoint_.get(), dir, backend_, options);
    const int64_t hidden = c.hidden_size, q_width = c.n_heads * c.head_dim,
                  kv_width = c.n_kv_heads * c.head_dim, hd = c.head_dim;
    const FfnNames names = ffn_names(c.family);
    // Under tensor parallelism a rank holds its heads' rows of q, k and v and their columns
    // of o_proj (whose bias rank 0 adds alone, since the ranks' outputs are summed).
    const parallel::Part tp = options.shard.attention();
    heads_ = parallel::split_heads(c.n_heads, c.n_kv_heads, tp);
    const auto rows = [&](int64_t h0, int64_t n) {
      return tp.whole() ? LinearSlice{} : LinearSlice::rows({h0 * hd, (h0 + n) * hd});
    };
    const LinearSlice q_rows = rows(heads_.q_begin, heads_.n_q), kv_rows = rows(heads_.kv_begin, heads_.n_kv);
    const LinearSlice o_columns =
        tp.whole() ? LinearSlice{}
                   : LinearSlice::columns({heads_.q_begin * hd, (heads_.q_begin + heads_.n_q) * hd}, tp.index == 0);
    attention_partial_ = !tp.whole();
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer layer;
      layer.input_norm = loader.floats(p + "input_layernorm.weight", {hidden});
      layer.post_attention_norm = loader.floats(p + "post_attention_layernorm.weight", {hidden});
      AttentionWeights& a = layer.attn;
      a.q = loader.linear(p + "self_attn.q_proj", q_width, hidden, c.attention_bias, q_rows);
      a.k = loader.linear(p + "self_attn.k_proj", kv_width, hidden, c.attention_bias, kv_rows);
      a.v = loader.linear(p + "self_attn.v_proj", kv_width, hidden, c.attention_bias, kv_rows);
      // o_proj carries a bias in some families (qwen3_moe with attention_bias), never in others.
      a.o = loader.linear(p + "self_attn.o_proj", hidden, q_width,
                          loader.has(p + "self_attn.o_proj.bias"), o_columns);
      if (c.qk_norm) {
        a.q_norm = loader.floats(p + "self_attn.q_norm.weight", {c.head_dim});
        a.k_norm = loader.floats(p + "self_attn.k_norm.weight", {c.head_dim});
      }
      // ModelOpt's FP8 KV cache scales (amax / 448), on the projection or on self_attn.
      layer.k_scale = loader.scalar_or({p + "self_attn.k_proj.k_scale", p + "self_attn.k_scale"}, 1.0f);
      layer.v_scale = loader.scalar_or({p + "self_attn.v_proj.v_scale", p + "self_attn.v_scale"}, 1.0f);
      layer.ffn = load_ffn(loader, c, l, names);
      layers_.push_back(std::move(layer));
    }
    io_ = load_token_io(loader, c);
    rope_ = upload_rope(backend_, c.rope);
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
    std::vector<KvLayerShape> out;
    for (const Layer& l : layers_)
      out.push_back({.n_kv_heads = heads_.n_kv, .k_dim = config_.head_dim, .v_dim = config_.head_dim,
                     .k_scale = l.k_scale, .v_scale = l.v_scale});
    return out;
  }

  void forward(const ops::Context& ctx, const StepInputs& in,
               const std::vector<ops::KvCacheLayer>& cache, TensorView logits) override {
    const ModelConfig& c = config_;
    ops::Backend& b = backend_;
    ops::Arena& arena = *ctx.arena;
    const DType act = b.activation_dtype();
    const int64_t n_tokens = in.token_ids.numel(), hidden = c.hidden_size;
    const int64_t n_heads = heads_.n_q, n_kv = heads_.n_kv, hd = c.head_dim;  // this rank's
    TETRA_CHECK(int64_t(cache.size()) == c.n_layers, "forward: the KV cache has ", cache.size(),
                " layers, the model ", c.n_layers);

    TensorView h = arena.alloc(act, {n_tokens, hidden});
    TensorView x = arena.alloc(act, {n_tokens, hidden});
    TensorView y = arena.alloc(act, {n_tokens, hidden});
    TensorView q = arena.alloc(act, {n_tokens, n_heads, hd});
    TensorView k = arena.alloc(act, {n_tokens, n_kv, hd});
    TensorView v = arena.alloc(act, {n_tokens, n_kv, hd});
    TensorView attn = arena.alloc(act, {n_tokens, n_heads, hd});
    const float scale = 1.0f / std::sqrt(float(hd));

    b.embedding(ctx, io_.embed, in.token_ids, h);
    b.rms_norm(ctx, h, layers_.front().input_norm, float(c.rms_norm_eps), x);
    const int64_t layer_scratch = arena.mark();  // each layer's ops' scratch is freed after it
    for (size_t l = 0; l < layers_.size(); ++l) {
      arena.rewind(layer_scratch);
      const Layer& layer = layers_[l];
      const AttentionWeights& a = layer.attn;
      // x holds rms_norm(h) with this layer's input norm.
      const ops::LinearPart qkv[] = {{&a.q, q.reshaped({n_tokens, n_heads * hd})},
                                     {&a.k, k.reshaped({n_tokens, n_kv * hd})},
                                     {&a.v, v.reshaped({n_tokens, n_kv * hd})}};
      b.linears(ctx, x, qkv);
      b.qk_norm_rope_kv_write(ctx, q, k, v, a.q_norm, a.k_norm, float(c.rms_norm_eps), rope_.spec, in.attn,
                              cache[l]);
      b.attention(ctx, q, cache[l], in.attn, scale, attn);
      b.linear(ctx, attn.reshaped({n_tokens, n_heads * hd}), a.o, y);
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
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;  // owns the mapping the CPU weights point into (null: dummy)
  std::vector<std::unique_ptr<ops::Buffer>> storage_;  // weights the backend does not own
  ops::Backend& backend_;
  TokenIo io_;
  std::vector<Layer> layers_;
  DeviceRope rope_;
  LoadStats stats_;
  parallel::HeadShard heads_;       // this rank's query and KV heads
  bool attention_partial_ = false;  // o_proj's output is this rank's part of the sum
};

}  // namespace

std::unique_ptr<Model> load_gqa_moe(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint,
                                    const std::filesystem::path& dir, ops::Backend& backend,
                                    const LoadOptions& options) {
  return std::make_unique<GqaMoeModel>(std::move(config), std::move(checkpoint), dir, backend, options);
}

}  // namespace tetra::model
