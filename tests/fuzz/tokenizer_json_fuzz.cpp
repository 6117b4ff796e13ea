// Fuzz target: tokenizer.json loading. Any input must load or throw tetra::Error; a loaded
// tokenizer must then encode and decode a fixed text without crashing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/fuzz/tokenizer_fuzz_common.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tetra::tok;
  try {
    Tokenizer t = Tokenizer::from_json(std::string_view(reinterpret_cast<const char*>(data), size));
    std::vector<TokenId> ids = t.encode("Hello <|im_end|> world 123 \xF0\x9F\x98\x80 caf\xC3\xA9");
    (void)t.decode(ids);
  } catch (const tetra::Error&) {
  }
  return 0;
}

std::vector<std::string> tetra_fuzz_seeds() {
  std::string full = tetra::tok::fuzz::small_tokenizer_json();
  return {full, "{}", "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"decoder\": {\"type\": \"ByteLevel\"}}",
          "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}, "
          "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a+)+$\"}, \"behavior\": \"Isolated\"}, "
          "\"decoder\": {\"type\": \"ByteLevel\"}}"};
}
