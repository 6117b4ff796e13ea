// tokenizer.json's `post_processor`: the special tokens HF's encode(text,
// add_special_tokens=True) puts around one sequence (TemplateProcessing's "single" template,
// BERT/RoBERTa's cls and sep; ByteLevel adds none).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"

namespace tetra::tok {

struct SpecialTokenWrap {
  std::vector<TokenId> prefix, suffix;  // ids before and after the text's own ids
  bool operator==(const SpecialTokenWrap&) const = default;
};

// `post_processor` (null: none); an unknown type or a malformed template throws tetra::Error
// naming `source`.
SpecialTokenWrap parse_post_processor(const nlohmann::json& j, const std::string& source);

}  // namespace tetra::tok
