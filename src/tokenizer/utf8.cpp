#include "tokenizer/utf8.h"

namespace tetra::tok {

namespace {

// Accepted range of the second byte after each lead byte (Unicode Table 3-7); later
// continuation bytes are always 80..BF.
struct LeadInfo {
  uint8_t n_bytes;   // 0: not a lead byte
  uint8_t lo, hi;    // range of the second byte
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

// Number of bytes of s[i..] that are a valid prefix of the sequence started at s[i]
// (at least 1 when s[i] is a lead byte).
size_t valid_prefix(std::string_view s, size_t i, LeadInfo info) {
  size_t k = 1;
  while (k < info.n_bytes && i + k < s.size()) {
    uint8_t c = static_cast<uint8_t>(s[i + k]);
    bool ok = k == 1 ? (c >= info.lo && c <= info.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) break;
    ++k;
  }
  return k;
}

}  // namespace

size_t utf8_valid_len(std::string_view s, size_t i) {
  uint8_t b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return 1;
  LeadInfo info = lead_info(b);
  if (info.n_bytes == 0) return 0;
  size_t k = valid_prefix(s, i, info);
  return k == info.n_bytes ? k : 0;
}

size_t utf8_invalid_len(std::string_view s, size_t i) {
  LeadInfo info = lead_info(static_cast<uint8_t>(s[i]));
  if (info.n_bytes == 0) return 1;
  return valid_prefix(s, i, info);
}

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs are the common case; skip them 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t n = utf8_valid_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t n = utf8_valid_len(s, i);
    if (n) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += utf8_invalid_len(s, i);
    }
  }
  return out;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  uint8_t b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  size_t n = utf8_valid_len(s, i);
  if (n == 0) {  // ill-formed or truncated: one U+FFFD for the maximal subpart
    i += utf8_invalid_len(s, i);
    return 0xFFFD;
  }
  char32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A sequence is at most 4 bytes, so its lead byte is among the last 3.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    size_t i = s.size() - back;
    uint8_t b = static_cast<uint8_t>(s[i]);
    if (b >= 0x80 && b < 0xC0) continue;  // continuation byte: look further back
    LeadInfo info = lead_info(b);
    if (info.n_bytes <= back) return 0;  // ASCII, invalid lead, or already complete
    return valid_prefix(s, i, info) == back ? back : 0;
  }
  return 0;
}

ByteLevelTable::ByteLevelTable() {
  char_to_byte.fill(-1);
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    char32_t c = printable ? static_cast<char32_t>(b) : next_extra++;
    byte_to_char[b] = c;
    char_to_byte[c] = static_cast<int16_t>(b);
    utf8_append(byte_to_utf8[b], c);
  }
}

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;
  return table;
}

}  // namespace tetra::tok
