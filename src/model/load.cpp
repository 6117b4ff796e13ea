// load_model: reads the config, opens the checkpoint and hands both to the family's loader.
#include "formats/safetensors.h"
#include "model/gqa_moe.h"
#include "model/mla_moe.h"
#include "model/model.h"

namespace tetra::model {

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, ops::Backend& backend,
                                  const LoadOptions& options) {
  ModelConfig config = load_model_config(dir);
  auto checkpoint = Checkpoint::open(dir);
  switch (config.family) {
    case ModelFamily::Qwen3Moe:
    case ModelFamily::Glm4Moe:
    case ModelFamily::Mixtral:
      return load_gqa_moe(std::move(config), std::move(checkpoint), backend, options);
    case ModelFamily::DeepseekV3:
    case ModelFamily::Glm4MoeLite:
    case ModelFamily::GlmMoeDsa:
      return load_mla_moe(std::move(config), std::move(checkpoint), backend, options);
  }
  fail(dir.string(), ": unknown model family");
}

}  // namespace tetra::model
