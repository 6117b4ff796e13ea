// Decoders with grouped-query attention and MoE feed-forward layers: qwen3_moe, glm4_moe and
// mixtral. One forward pass; the families differ only in config features and tensor names.
#pragma once

#include <memory>

#include "formats/safetensors.h"
#include "model/model.h"

namespace tetra::model {

std::unique_ptr<Model> load_gqa_moe(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint,
                                    ops::Backend& backend, const LoadOptions& options);

}  // namespace tetra::model
