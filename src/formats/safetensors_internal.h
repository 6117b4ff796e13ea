// Helpers shared by the safetensors reader, index and writer; not part of the public interface.
#pragma once

#include <string>
#include <string_view>

namespace tetra {

// A tensor name or key for an error message: quoted, control bytes shown as '?', and cut at
// 120 bytes so a hostile 100 MB key cannot turn one sentence into a flood.
inline std::string quote_name(std::string_view s) {
  constexpr size_t kMax = 120;
  size_t n = s.size();
  if (n > kMax) {
    n = kMax;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;  // whole UTF-8 chars
  }
  std::string out = "'";
  for (size_t i = 0; i < n; ++i)
    out += (static_cast<unsigned char>(s[i]) < 0x20 || s[i] == 0x7f) ? '?' : s[i];
  if (s.size() > kMax) out += "...";
  return out + "'";
}

}  // namespace tetra
