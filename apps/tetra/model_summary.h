// One-paragraph descriptions of a model's architecture, shared by inspect and generate.
#pragma once

#include <string>

#include "formats/model_config.h"

namespace tetra::cli {

std::string describe_architecture(const ModelConfig& c);

}  // namespace tetra::cli
