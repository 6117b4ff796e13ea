// Decoders with grouped-query attention and MoE feed-forward layers: qwen3_moe, glm4_moe and
// mixtral. One forward pass; the families differ only in config features and tensor names.
#pragma once

#include <filesystem>
#include <memory>

#include "formats/safetensors.h"
#include "model/model.h"

namespace tetra::model {

// checkpoint null: dummy weights (--load-format dummy) for the config in `dir`.
std::unique_ptr<Model> load_gqa_moe(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint,
                                    const std::filesystem::path& dir, ops::Backend& backend,
                                    const LoadOptions& options);

}  // namespace tetra::model
