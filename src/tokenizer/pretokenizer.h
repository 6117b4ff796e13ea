// The text pipeline of tokenizer.json between added-token extraction and the BPE model:
// `normalizer` (NFC/NFD/NFKC/NFKD, Sequence) and `pre_tokenizer` (Split, ByteLevel,
// Sequence). Components this engine does not implement are refused at load.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace tetra::tok {

class Normalizer {
 public:
  static Normalizer from_json(const nlohmann::json& j);  // j may be null
  bool is_identity() const { return forms_.empty(); }
  // Returns the normalized text; `text` must be valid UTF-8.
  std::string apply(std::string_view text) const;

 private:
  enum class Form { NFC, NFD, NFKC, NFKD };
  std::vector<Form> forms_;
};

// A piece of text as [begin, end) byte offsets into the normalized section.
using Span = std::pair<size_t, size_t>;

class PreTokenizer {
 public:
  static PreTokenizer from_json(const nlohmann::json& j);  // j may be null
  // Splits `text` into pieces, appended to `out` (offsets relative to text).
  void split(std::string_view text, std::vector<Span>& out) const;

 private:
  enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
  struct Step {
    Regex regex;
    Behavior behavior;
    bool invert;
  };
  void add_json(const nlohmann::json& j);
  std::vector<Step> steps_;
};

}  // namespace tetra::tok
