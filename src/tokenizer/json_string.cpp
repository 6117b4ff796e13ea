#include "tokenizer/json_string.h"

#include "tokenizer/utf8.h"

namespace tetra::tok {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

int hex4(std::string_view s, size_t i) {
  if (i + 4 > s.size()) return -1;
  int v = 0;
  for (size_t k = i; k < i + 4; ++k) {
    char c = s[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

bool parse_json_string(std::string_view s, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  if (i >= s.size() || s[i] != '"') return false;
  ++i;
  while (true) {
    if (i >= s.size()) return false;
    char c = s[i];
    if (c == '"') {
      ++i;
      break;
    }
    if (static_cast<unsigned char>(c) < 0x20) return false;
    if (c != '\\') {
      out += c;
      ++i;
      continue;
    }
    if (++i >= s.size()) return false;
    char e = s[i++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        int u = hex4(s, i);
        if (u < 0) return false;
        i += 4;
        char32_t cp = static_cast<char32_t>(u);
        if (u >= 0xD800 && u <= 0xDBFF && i + 6 <= s.size() && s[i] == '\\' && s[i + 1] == 'u') {
          int lo = hex4(s, i + 2);
          if (lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((static_cast<char32_t>(u) - 0xD800) << 10) + (static_cast<char32_t>(lo) - 0xDC00);
            i += 6;
          }
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogate
        utf8_append(out, cp);
        break;
      }
      default: return false;
    }
  }
  while (i < s.size() && is_space(s[i])) ++i;
  return i == s.size();
}

}  // namespace tetra::tok
