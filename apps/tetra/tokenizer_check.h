// A tokenizer must fit the model it feeds: every id it can produce needs an embedding row.
#pragma once

#include <filesystem>

#include "formats/model_config.h"
#include "tokenizer/tokenizer.h"

namespace tetra::cli {

// Throws one sentence when the tokenizer in `dir` has more ids than config.json's vocab_size.
void check_tokenizer_fits(const tok::Tokenizer& tokenizer, const ModelConfig& config,
                          const std::filesystem::path& dir);

}  // namespace tetra::cli
