// A loaded model: its config, the KV layout it needs, and one forward step over a ragged batch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/model_config.h"
#include "ops/ops.h"
#include "parallel/sharding.h"

namespace tetra::model {

// What one layer stores per cached token: KV heads x (key width, value width), plus the
// DSA indexer's key. MLA layers store one "head": the latent and rope key as k, no v.
struct KvLayerShape {
  int64_t n_kv_heads = 0;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
  int64_t index_dim = 0;
  // An FP8 KV cache's per-tensor scales (ops::KvCacheLayer): the checkpoint's k_scale and
  // v_scale where it has them (ModelOpt with kv_cache_quant_algo FP8), else 1.
  float k_scale = 1.0f, v_scale = 1.0f;
};

// The inputs of one step, already on the backend's device.
struct StepInputs {
  TensorView token_ids;     // I32 [T]
  ops::AttentionBatch attn;
  TensorView logit_rows;    // I32 [R]: the token rows whose next-token logits are wanted
};

struct LoadStats {
  int64_t tensors = 0;
  int64_t bytes = 0;
  int64_t routed_expert_bytes = 0;  // of them, every MoE layer's routed experts (not shared ones)
};

struct LoadOptions {
  // Called after each tensor is checked and made available to the backend.
  std::function<void(const LoadStats&)> on_progress;
  // --load-format dummy: random weights from config.json alone (no safetensors read), in the
  // formats its quantization_config gives each module.
  bool dummy = false;
  // --hf-overrides: a JSON object's text merged into config.json before it is read
  // (formats/config_overrides.h); with fewer num_hidden_layers, only the layers left are loaded.
  std::string hf_overrides;
  // The part of the model this rank holds under --tp/--ep (parallel/sharding.h); one rank
  // holds all of it.
  parallel::RankShard shard;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::vector<KvLayerShape> kv_layout() const = 0;
  // Runs every layer over the batch, writes its K/V to `cache` (one entry per layer) and the
  // logits of the selected rows to `logits` (F32 [R, vocab]; empty: none, as on the ranks
  // after the first). Scratch comes from ctx.arena, which the caller resets before the call;
  // ops run on ctx's stream; a sharded model's collectives go through ctx.comm.
  virtual void forward(const ops::Context& ctx, const StepInputs& in,
                       const std::vector<ops::KvCacheLayer>& cache, TensorView logits) = 0;
  virtual LoadStats load_stats() const = 0;
  // The routed experts of every MoE layer (for the backend's warm-up).
  virtual std::vector<const ops::MoeExperts*> moe_experts() const = 0;
};

// Loads DIR (config.json + safetensors) for `backend`; every tensor is checked against the
// config before use and a problem is one sentence naming the file.
std::unique_ptr<Model> load_model(const std::filesystem::path& dir, ops::Backend& backend,
                                  const LoadOptions& options = {});

}  // namespace tetra::model
