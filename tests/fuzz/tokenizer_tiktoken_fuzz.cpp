// Fuzz target: tiktoken.model parsing (Kimi K2's tokenizer file). Any input must parse or
// throw tetra::Error; a parsed model, with Kimi's pattern and special tokens, must then encode
// and decode a fixed text without crashing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string b64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) v |= uint8_t(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tetra::tok;
  try {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    std::vector<std::string> ranks = parse_tiktoken_ranks(text, "fuzz");
    nlohmann::json config = {{"added_tokens_decoder", {{std::to_string(ranks.size() + 2), {{"content", "<|im_end|>"}}}}}};
    Tokenizer t = Tokenizer::from_tiktoken(ranks, kimi_special_tokens(config, ranks.size(), "fuzz"),
                                           kimi_pretokenizer_pattern(), {.window_chars = 64, .run_chars = 8});
    std::vector<TokenId> ids = t.encode("Hello <|im_end|> world 123 \xE4\xB8\xAD\xE6\x96\x87 caf\xC3\xA9  \n\n x");
    (void)t.decode(ids);
  } catch (const tetra::Error&) {
  }
  return 0;
}

std::vector<std::string> tetra_fuzz_seeds() {
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += b64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  std::string merges = bytes;
  int rank = 256;
  for (const char* t : {"He", "ll", "llo", "Hello", " w", "or", " wor", " world", "\xE4\xB8", "\xE4\xB8\xAD", "  "})
    merges += b64(t) + " " + std::to_string(rank++) + "\n";
  return {bytes, merges, "", "IQ== 0\n", "IQ== 0\nIQ== 1\n", "!!!! 0\n"};
}
