// A Hugging Face byte-level BPE tokenizer loaded from tokenizer.json (FORMATS.md §5), giving
// the ids of `tokenizer.encode(text, add_special_tokens=...)` and the text of
// `tokenizer.decode(ids)`. Encoding and decoding are const and thread-safe.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"

namespace tetra::tok {

struct EncodeOptions {
  // Match special-token strings typed in the text (HF's default). A server that must not let
  // user text produce control tokens sets this to false.
  bool parse_special = true;
  // Wrap the ids in the tokenizer's own special tokens (BOS, ...), as HF's
  // add_special_tokens=True does: a text prompt. A rendered chat template writes its own.
  bool add_special_tokens = false;
};

struct DecodeOptions {
  bool skip_special = false;
};

// Where long texts are cut before encoding, as Kimi's tokenization_kimi.py does (to keep
// tiktoken's regex and BPE bounded): windows of at most `window_chars` code points, each cut
// again where a run of whitespace or of non-whitespace (Python's str.isspace) would pass
// `run_chars`. The pieces are encoded independently. 0: no cut.
struct TextChunking {
  size_t window_chars = 0, run_chars = 0;
};

// What tokenizer_config.json (and chat_template.jinja) add to tokenizer.json.
struct TokenizerConfig {
  std::string chat_template;  // empty when the model ships none
  std::optional<std::string> bos_token, eos_token;
  // Set: they decide whether BOS / EOS wrap a sequence, over tokenizer.json's post_processor
  // (transformers' Llama-style tokenizers rebuild the post-processor from them).
  std::optional<bool> add_bos_token, add_eos_token;
};

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names it in error messages.
  static Tokenizer from_json(std::string_view json, const std::string& source = "tokenizer.json");
  // Loads DIR/tokenizer.json, DIR/tokenizer_config.json (optional) and DIR/chat_template.jinja
  // (optional; it takes precedence over the config's chat_template, as in transformers).
  // When the folder has no tokenizer.json but a tiktoken.model (Kimi K2), that is loaded
  // instead (tokenizer/tiktoken.h).
  static Tokenizer load(const std::filesystem::path& model_dir);
  // A tiktoken-format BPE: `rank_bytes[r]` is token r's bytes, `specials` the added tokens
  // (matched exactly, never normalized), `pattern` the pre-tokenizer regex (PCRE2).
  static Tokenizer from_tiktoken(const std::vector<std::string>& rank_bytes, std::vector<AddedToken> specials,
                                 const std::string& pattern, TextChunking chunking = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Invalid UTF-8 in `text` is replaced by U+FFFD first.
  std::vector<TokenId> encode(std::string_view text, EncodeOptions options = {}) const;
  // Ids with no token (past the vocabulary, in the padded part of the embedding table) are
  // skipped, as HF does; a negative id throws tetra::Error.
  std::string decode(std::span<const TokenId> ids, DecodeOptions options = {}) const;

  // The bytes one token decodes to (before UTF-8 repair), or nullopt for an unknown id.
  std::optional<std::string_view> token_bytes(TokenId id) const;
  std::optional<TokenId> token_to_id(std::string_view token) const;  // vocab or added token
  std::optional<std::string_view> id_to_token(TokenId id) const;
  bool is_special(TokenId id) const;
  // One past the largest id (the embedding table may be larger: it is padded).
  size_t vocab_size() const { return id_to_token_.size(); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // What add_special_tokens puts around a text: post_processor, then tokenizer_config's rule.
  const SpecialTokenWrap& special_wrap() const { return wrap_; }

  const TokenizerConfig& config() const { return config_; }
  void set_config(TokenizerConfig config);

 private:
  Tokenizer();
  void encode_normalized(std::string_view text, std::vector<TokenId>& out) const;
  // Byte offsets in `text` where TextChunking cuts it (ascending, none at 0).
  std::vector<size_t> chunk_cuts(std::string_view text) const;
  // Fills the id tables and the added-token matchers from bpe_ and added_.
  void index_tokens(size_t n_ids);

  struct WordCache;
  BpeModel bpe_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  std::vector<AddedToken> added_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<std::string> id_to_token_;  // token string as written in tokenizer.json
  std::vector<std::string> id_bytes_;     // what each id decodes to
  std::vector<uint8_t> id_flags_;         // kKnown | kSpecial
  std::unique_ptr<WordCache> cache_;
  TokenizerConfig config_;
  SpecialTokenWrap post_processor_;  // from tokenizer.json alone
  SpecialTokenWrap wrap_;            // post_processor_ with config_'s add_bos/eos_token applied
  TextChunking chunking_;
};

// True when `model_dir` has a tokenizer Tokenizer::load reads (tokenizer.json or tiktoken.model).
bool has_tokenizer(const std::filesystem::path& model_dir);

// Parses a tokenizer_config.json text (chat_template, bos/eos tokens, add_bos_token).
TokenizerConfig parse_tokenizer_config(std::string_view json, const std::string& source);

}  // namespace tetra::tok
