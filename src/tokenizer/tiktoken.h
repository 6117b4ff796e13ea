// Tokenizers shipped as a tiktoken.model (Kimi K2, Kimi Linear) instead of tokenizer.json:
// byte-level BPE whose merge order is the rank of the merged bytes (FORMATS.md-style facts in
// tiktoken.cpp). The model folder also has tokenizer_config.json, whose added_tokens_decoder
// names the special tokens; the pre-tokenizer regex is the model's own (tokenization_kimi.py),
// not in any data file, so it is known here by the tokenizer class the config names.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/added_tokens.h"

namespace tetra::tok {

class Tokenizer;

// Parses tiktoken.model text: one "<base64 bytes> <rank>" per line. The ranks must be exactly
// 0..n-1 (each once), each byte sequence must appear once, and every single byte must be a
// token (else some text could not be encoded). Returns the bytes of each rank.
std::vector<std::string> parse_tiktoken_ranks(std::string_view text, const std::string& source);

// Kimi's pre-tokenizer (tokenization_kimi.py's pat_str), written for PCRE2: its class
// intersections [X&&[^\p{Han}]] become (?:(?!\p{Han})[X]).
const std::string& kimi_pretokenizer_pattern();

// The special tokens of a Kimi tokenizer with `n_base` ranks: ids n_base .. n_base+255, named
// by the config's added_tokens_decoder (which may also name a few ids past them), the rest
// "<|reserved_token_ID|>", as tokenization_kimi.py builds them.
std::vector<AddedToken> kimi_special_tokens(const nlohmann::json& tokenizer_config, size_t n_base,
                                            const std::string& source);

// DIR/tiktoken.model + DIR/tokenizer_config.json (+ DIR/chat_template.jinja when present).
Tokenizer load_tiktoken_tokenizer(const std::filesystem::path& dir);

}  // namespace tetra::tok
