// generation_config.json (Hugging Face GenerationConfig): the end-of-sequence ids generation
// stops at, and the sampling values the model's authors recommend. Qwen3 lists two EOS ids
// there while config.json has one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra {

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;  // empty when the file sets none
  // Sampling defaults; absent when the file does not set them.
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<int64_t> top_k;  // 0: all tokens
};

// Parses and validates; `source` names the file in error messages; ids must be below
// `vocab_size`.
GenerationConfig parse_generation_config(const nlohmann::json& j, const std::string& source, int64_t vocab_size);
// Reads DIR/generation_config.json; nullopt when the folder has none.
std::optional<GenerationConfig> load_generation_config(const std::filesystem::path& dir, int64_t vocab_size);

}  // namespace tetra
