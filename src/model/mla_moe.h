// Decoders with multi-head latent attention (MLA) and MoE feed-forward layers: deepseek_v3
// (DeepSeek-V3, Kimi K2), glm4_moe_lite (GLM-4.7-Flash) and glm_moe_dsa (GLM-5, with the DSA
// indexer). The KV cache holds each token's compressed latent and rope key, not per-head K/V.
#pragma once

#include <filesystem>
#include <memory>

#include "formats/safetensors.h"
#include "model/model.h"

namespace tetra::model {

// checkpoint null: dummy weights (--load-format dummy) for the config in `dir`.
std::unique_ptr<Model> load_mla_moe(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint,
                                    const std::filesystem::path& dir, ops::Backend& backend,
                                    const LoadOptions& options);

}  // namespace tetra::model
