// Lexer for the Jinja2 subset of chat templates, configured as transformers configures
// Jinja2: trim_blocks, lstrip_blocks, keep_trailing_newline=False, default delimiters.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tetra::tok::jinja {

enum class TokenKind {
  Data,        // template text, whitespace control already applied
  VarBegin, VarEnd, BlockBegin, BlockEnd,
  Name, String, Int, Float, Op,
  End,
};

struct Token {
  TokenKind kind;
  std::string text;  // decoded value for String, spelling otherwise
  int line;
};

// Throws tetra::Error("chat template line N: ...") on malformed input.
std::vector<Token> lex(std::string_view source);

}  // namespace tetra::tok::jinja
