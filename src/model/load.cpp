// load_model: reads the config, opens the checkpoint (or not, for dummy weights), checks that
// the weights fit the device, and hands both to the family's loader.
#include <algorithm>
#include <cmath>
#include <string>

#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "model/gqa_moe.h"
#include "model/mla_moe.h"
#include "model/model.h"
#include "model/weights.h"

namespace tetra::model {

namespace {

// What dummy weights will take on the device: dense weights in BF16, routed and shared experts
// NVFP4 where the quant config says so.
int64_t dummy_weight_bytes(const std::filesystem::path& dir, const ModelConfig& c, const LoadOptions& options) {
  int64_t moe_layers = 0;
  for (bool moe : c.layer_is_moe) moe_layers += moe ? 1 : 0;
  const int64_t experts = moe_layers * (c.n_routed_experts + c.n_shared_experts);
  const auto quant = load_quant_config(dir, options.hf_overrides);
  const bool nvfp4 =
      quant && is_nvfp4(quant->module_quant("model.layers.0.mlp.experts.0.gate_proj").algo);
  const ops::WeightFormat format = nvfp4 ? ops::WeightFormat::Nvfp4 : ops::WeightFormat::Dense;
  const int64_t expert_params = experts * 3 * c.hidden_size * c.moe_intermediate_size;
  const int64_t rest = std::max<int64_t>(0, model_sizes(c).params_total - expert_params);
  return rest * 2 + experts * expert_bytes(format, c.hidden_size, c.moe_intermediate_size);
}

// What the checkpoint's weights will take on the device: every tensor but those of the layers
// at or past num_hidden_layers (the MTP layers, which generation skips, and the layers
// --hf-overrides cut off), which are never read.
int64_t checkpoint_weight_bytes(const Checkpoint& checkpoint, const ModelConfig& c) {
  int64_t bytes = 0;
  for (const std::string& name : checkpoint.names()) {
    if (tensor_layer(name) >= c.n_layers) continue;
    const TensorInfo* info = checkpoint.find(name);
    bytes += int64_t(info->end - info->begin);
  }
  return bytes;
}

}  // namespace

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, ops::Backend& backend,
                                  const LoadOptions& options) {
  ModelConfig config = load_model_config(dir, options.hf_overrides);
  std::unique_ptr<Checkpoint> checkpoint;
  if (!options.dummy) checkpoint = Checkpoint::open(dir);
  const ops::MemoryInfo mem = backend.memory_info();
  if (mem.free_bytes > 0) {
    const int64_t need =
        options.dummy ? dummy_weight_bytes(dir, config, options) : checkpoint_weight_bytes(*checkpoint, config);
    auto gib = [](int64_t b) { return std::round(double(b) / (1 << 30) * 10) / 10; };
    TETRA_CHECK(need < mem.free_bytes, dir.string(), ": the weights need ", gib(need), " GiB but ",
                backend.name(), " has ", gib(mem.free_bytes), " GiB free of ", gib(mem.total_bytes),
                " (nothing was uploaded)");
  }
  switch (config.family) {
    case ModelFamily::Qwen3Moe:
    case ModelFamily::Glm4Moe:
    case ModelFamily::Mixtral:
      return load_gqa_moe(std::move(config), std::move(checkpoint), dir, backend, options);
    case ModelFamily::DeepseekV3:
    case ModelFamily::Glm4MoeLite:
    case ModelFamily::GlmMoeDsa:
      return load_mla_moe(std::move(config), std::move(checkpoint), dir, backend, options);
  }
  fail(dir.string(), ": unknown model family");
}

}  // namespace tetra::model
