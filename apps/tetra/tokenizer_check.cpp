#include "tokenizer_check.h"

#include "core/error.h"

namespace tetra::cli {

void check_tokenizer_fits(const tok::Tokenizer& tokenizer, const ModelConfig& config,
                          const std::filesystem::path& dir) {
  // The embedding table may be padded past the tokenizer (vocab_size larger), never shorter.
  const char* file = std::filesystem::exists(dir / "tokenizer.json") ? "tokenizer.json" : "tiktoken.model";
  TETRA_CHECK(int64_t(tokenizer.vocab_size()) <= config.vocab_size, (dir / file).string(),
              " has ", tokenizer.vocab_size(), " token ids, more than the model's vocab_size of ",
              config.vocab_size, " in config.json: the tokenizer does not belong to this model");
}

}  // namespace tetra::cli
