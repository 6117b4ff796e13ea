// UTF-8 helpers shared by the tokenizer and the template engine: validation with U+FFFD
// replacement (maximal subparts, as Python's decode(errors="replace") and Rust's
// from_utf8_lossy do), code point iteration, and the GPT-2 byte <-> character table.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tetra::tok {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there do not form
// one (invalid lead, bad continuation, overlong, surrogate, above U+10FFFF, truncated).
size_t utf8_valid_len(std::string_view s, size_t i);

// Length of the maximal subpart of an ill-formed sequence at s[i] (>= 1): the bytes one
// U+FFFD replaces.
size_t utf8_invalid_len(std::string_view s, size_t i);

bool utf8_is_valid(std::string_view s);

// s with every ill-formed subpart replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

// Decodes the code point at s[i] and advances i; an ill-formed or truncated sequence reads
// as U+FFFD and advances past its maximal subpart, so no input reads beyond s.
char32_t utf8_next(std::string_view s, size_t& i);

void utf8_append(std::string& out, char32_t cp);

// Number of trailing bytes of s that form an incomplete but still possibly valid sequence
// (0..3): a streaming decoder holds them back until the next bytes arrive.
size_t utf8_incomplete_tail(std::string_view s);

// GPT-2's bytes_to_unicode: every byte maps to a printable character so that BPE tokens are
// strings without spaces or control characters.
struct ByteLevelTable {
  std::array<char32_t, 256> byte_to_char{};
  std::array<std::string, 256> byte_to_utf8;
  // Characters in the table are all below U+0144; -1 marks a character not in the table.
  std::array<int16_t, 0x144> char_to_byte{};
  ByteLevelTable();
  int byte_of(char32_t c) const { return c < char_to_byte.size() ? char_to_byte[c] : -1; }
};
const ByteLevelTable& byte_level_table();

}  // namespace tetra::tok
