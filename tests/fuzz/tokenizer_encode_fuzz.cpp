// Fuzz target: encoding arbitrary bytes (invalid UTF-8, NULs, special-token fragments) with a
// tokenizer that has NFC, a Qwen-style split regex and added tokens with every flag; the
// ids must decode, stream-decode to the same text, and re-encode stably.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/fuzz/tokenizer_fuzz_common.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tetra::tok;
  static const Tokenizer tok = Tokenizer::from_json(fuzz::small_tokenizer_json());
  std::string_view text(reinterpret_cast<const char*>(data), size);
  bool parse_special = size > 0 && (data[0] & 1);
  std::vector<TokenId> ids = tok.encode(text, EncodeOptions{.parse_special = parse_special});
  std::string decoded = tok.decode(ids);
  if (!utf8_is_valid(decoded)) std::abort();
  IncrementalDecoder stream(tok);
  std::string streamed;
  for (TokenId id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  if (streamed != decoded) std::abort();
  return 0;
}

std::vector<std::string> tetra_fuzz_seeds() {
  return {"Hello world", "<|im_start|>user\nhi<|im_end|>", "a [L] b [R] c word words", "e\xCC\x81 caf\xC3\xA9",
          std::string("\0\xFF\xFE\xC0\xAF\xED\xA0\x80", 8), "   \n\n\t 123456 it's IT'S", "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9"};
}
