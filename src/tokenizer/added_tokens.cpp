#include "tokenizer/added_tokens.h"

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace tetra::tok {

namespace {

// Rust's char::is_whitespace and char::is_alphanumeric, which HF uses for these rules.
bool is_whitespace(char32_t c) {
  return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_alphanumeric(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

char32_t last_char(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<uint8_t>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i == 0) return 0;
  --i;
  size_t j = i;
  return utf8_next(s, j);
}

}  // namespace

void AddedTokenMatcher::add(std::string_view content, int token_index) {
  if (content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : content) {
    auto it = nodes_[node].next.find(c);
    if (it == nodes_[node].next.end()) {
      nodes_.push_back(Node{});
      int32_t child = static_cast<int32_t>(nodes_.size() - 1);
      nodes_[node].next[c] = child;
      node = child;
    } else {
      node = it->second;
    }
  }
  nodes_[node].token_index = token_index;
  first_byte_[static_cast<uint8_t>(content[0])] = true;
}

void AddedTokenMatcher::split(std::string_view text, const std::vector<AddedToken>& tokens,
                              bool match_special, std::vector<Section>& out) const {
  size_t plain_begin = 0;  // start of the pending plain section
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t node = 0, best = -1;
    size_t best_end = i;
    for (size_t j = i; j < text.size(); ++j) {
      auto it = nodes_[node].next.find(static_cast<uint8_t>(text[j]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      int32_t t = nodes_[node].token_index;
      if (t >= 0) best = t, best_end = j + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens[best];
    // Like HF's non-overlapping automaton, a rejected match still consumes its bytes.
    if (tok.special && !match_special) {
      i = best_end;
      continue;
    }
    size_t start = i, stop = best_end;
    if (tok.single_word) {
      bool left_ok = start == 0 || !is_alphanumeric(last_char(text.substr(0, start)));
      size_t k = stop;
      bool right_ok = stop == text.size() || !is_alphanumeric(utf8_next(text, k));
      if (!left_ok || !right_ok) {
        i = best_end;
        continue;
      }
    }
    if (tok.lstrip) {
      // Whitespace already claimed by the previous token's rstrip stays claimed.
      while (start > plain_begin) {
        size_t p = start - 1;
        while (p > plain_begin && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_whitespace(utf8_next(text, q))) break;
        start = p;
      }
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        size_t q = stop;
        if (!is_whitespace(utf8_next(text, q))) break;
        stop = q;
      }
    }
    if (start > plain_begin) out.push_back({plain_begin, start, -1});
    out.push_back({start, stop, tok.id});
    plain_begin = i = stop;
  }
  if (plain_begin < text.size()) out.push_back({plain_begin, text.size(), -1});
}

}  // namespace tetra::tok
