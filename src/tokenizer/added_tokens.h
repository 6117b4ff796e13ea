// Added tokens (tokenizer.json `added_tokens`): found in the text before the BPE pipeline
// sees it, leftmost-longest, with HF's single_word / lstrip / rstrip rules. Tokens with
// normalized=false are matched in the raw text; normalized=true ones in the normalized text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"

namespace tetra::tok {

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A section of text: either plain text [begin, end) or one added token.
struct Section {
  size_t begin, end;
  TokenId token;  // -1 for plain text
};

// A byte trie over token contents, scanned leftmost-longest.
class AddedTokenMatcher {
 public:
  void add(std::string_view content, int token_index);
  // Splits `text` into sections. `tokens` gives each index's flags; special tokens are
  // skipped when !match_special.
  void split(std::string_view text, const std::vector<AddedToken>& tokens, bool match_special,
             std::vector<Section>& out) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::unordered_map<uint8_t, int32_t> next;
    int32_t token_index = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_byte_[256] = {};
};

}  // namespace tetra::tok
