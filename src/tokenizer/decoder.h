// Streaming detokenization: text is released only once its UTF-8 characters are complete, and
// the concatenation of everything released equals Tokenizer::decode of all ids (invalid bytes
// become U+FFFD in both).
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace tetra::tok {

class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, DecodeOptions options = {})
      : tokenizer_(&tokenizer), options_(options) {}

  // Adds one generated token; returns the text it completes (often empty mid-character).
  // Ids without a token add nothing, as in Tokenizer::decode; a negative id throws.
  std::string push(TokenId id);
  // Ends the stream: returns the held-back bytes, repaired (U+FFFD) if incomplete.
  std::string finish();
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;
};

}  // namespace tetra::tok
