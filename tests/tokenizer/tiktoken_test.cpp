// The tiktoken.model loader (Kimi K2's tokenizer format): file validation, rank-order merging,
// Kimi's pattern (Han runs split from other letters), special tokens and the folder loader.
// Corpus parity with the Rust tiktoken is in parity_test.cpp (kimi_tiktoken).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"

namespace tetra::tok {
namespace {

std::string b64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (bytes.size() - i == 2) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// The 256 single bytes (rank = byte value), then `extra` in rank order.
std::string model_text(const std::vector<std::string>& extra) {
  std::string text;
  for (int b = 0; b < 256; ++b) text += b64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  for (size_t i = 0; i < extra.size(); ++i) text += b64(extra[i]) + " " + std::to_string(256 + i) + "\n";
  return text;
}

Tokenizer small(const std::vector<std::string>& extra, std::vector<AddedToken> specials = {}) {
  return Tokenizer::from_tiktoken(parse_tiktoken_ranks(model_text(extra), "test"), std::move(specials),
                                  kimi_pretokenizer_pattern());
}

TEST(Tiktoken, ParsesRanksAndRejectsMalformedFiles) {
  std::vector<std::string> r = parse_tiktoken_ranks(model_text({"ab", "\xe4\xb8\xad"}), "m");
  ASSERT_EQ(r.size(), 258u);
  EXPECT_EQ(r[256], "ab");
  EXPECT_EQ(r[257], "\xe4\xb8\xad");
  const std::string good = model_text({});
  auto refuses = [](const std::string& text, const std::string& what) {
    try {
      parse_tiktoken_ranks(text, "m");
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refuses(good + "YWI* 256\n", "not base64");
  refuses(good + "YWI= 256 7\n", "expected '<base64> <rank>'");
  refuses(good + "YWI= x\n", "not a number");
  refuses(good + "YWI= 255\n", "rank 255 appears twice");
  refuses(good + "AA== 256\n", "the same bytes appear twice");
  refuses(good + "YWI= 257\n", "rank 256 is missing");
  refuses(good + "YWI= 1000000000\n", "rank 1000000000 is out of range");
  refuses(good + b64(std::string(5000, 'a')) + " 256\n", "a token of 5000 bytes is longer than 4096");
  refuses(model_text({}).substr(model_text({}).find('\n') + 1), "rank 0 is missing");
  refuses("", "has no tokens");
  // Without byte 0x00 some text could not be encoded.
  std::string no_zero;
  for (int b = 1; b < 256; ++b) no_zero += b64(std::string(1, char(b))) + " " + std::to_string(b - 1) + "\n";
  refuses(no_zero, "the single byte 0 is not a token");
}

TEST(Tiktoken, MergesByRankOfTheMergedBytes) {
  // "abc" is reachable only as ab+c (bc is no token); the lowest-ranked pair merges first.
  Tokenizer t = small({"ab", "abc", "cd", "bcd"});
  EXPECT_EQ(t.encode("abc"), (std::vector<TokenId>{257}));
  // a b c d: ab (256) beats cd (258): ab c d -> abc (257) beats cd -> abc d.
  EXPECT_EQ(t.encode("abcd"), (std::vector<TokenId>{257, 'd'}));
  EXPECT_EQ(t.decode(t.encode("abcd")), "abcd");
  EXPECT_EQ(t.encode("x"), (std::vector<TokenId>{'x'}));
}

TEST(Tiktoken, KimiPatternSplitsHanFromOtherLetters) {
  // As one piece, "ab中文" would merge into ab中 (259) + 文 (261): "ab中" outranks "中文".
  // Kimi's pattern splits the Han run from the letters before it: ab (256) + 中文 (262).
  Tokenizer t = small({"ab", "\xe4\xb8", "\xe4\xb8\xad", "ab\xe4\xb8\xad", "\xe6\x96", "\xe6\x96\x87",
                       "\xe4\xb8\xad\xe6\x96\x87"});
  EXPECT_EQ(t.encode("ab\xe4\xb8\xad\xe6\x96\x87"), (std::vector<TokenId>{256, 262}));
  EXPECT_EQ(t.encode("\xe4\xb8\xad"), (std::vector<TokenId>{258}));
  // Contractions: "'s" stays with the word before it only through its own alternative.
  Tokenizer c = small({"it", "'s", "it's"});
  EXPECT_EQ(c.encode("it's"), (std::vector<TokenId>{258}));
  EXPECT_EQ(c.encode("it'S"), (std::vector<TokenId>{256, '\'', 'S'}));  // (?i) splits, but "'S" is no token
}

TEST(Tiktoken, KimiSpecialTokensAreReservedAndNamed) {
  nlohmann::json config = {{"added_tokens_decoder",
                            {{"258", {{"content", "<|im_end|>"}, {"special", true}}},
                             {"259", {{"content", "[BOS]"}, {"special", true}}}}}};
  std::vector<AddedToken> specials = kimi_special_tokens(config, 258, "cfg");
  ASSERT_EQ(specials.size(), 256u);
  EXPECT_EQ(specials[0].content, "<|im_end|>");
  EXPECT_EQ(specials[2].content, "<|reserved_token_260|>");
  EXPECT_EQ(specials.back().id, 258 + 255);
  Tokenizer t = Tokenizer::from_tiktoken(parse_tiktoken_ranks(model_text({"hi", "<|"}), "m"), specials,
                                         kimi_pretokenizer_pattern());
  EXPECT_EQ(t.encode("hi<|im_end|>"), (std::vector<TokenId>{256, 258}));
  EXPECT_EQ(t.encode("hi<|im_end|>", {.parse_special = false}).front(), 256);
  EXPECT_NE(t.encode("hi<|im_end|>", {.parse_special = false}).back(), 258);
  EXPECT_EQ(t.decode(std::vector<TokenId>{259, 256, 258}), "[BOS]hi<|im_end|>");
  EXPECT_EQ(t.decode(std::vector<TokenId>{259, 256, 258}, {.skip_special = true}), "hi");
  EXPECT_EQ(t.token_to_id("<|reserved_token_300|>"), 300);
  EXPECT_TRUE(t.is_special(300));
  EXPECT_EQ(t.vocab_size(), 258u + 256u);
  EXPECT_THROW(kimi_special_tokens({{"added_tokens_decoder", {{"12", {{"content", "x"}}}}}}, 258, "cfg"), Error);
  EXPECT_THROW(kimi_special_tokens({{"added_tokens_decoder", {{"2x", {{"content", "x"}}}}}}, 258, "cfg"), Error);
}

TEST(Tiktoken, KimiCutsLongRunsBeforeEncoding) {
  // tokenization_kimi.py encodes a run of more than 25,000 non-space (or space) characters in
  // pieces of 25,000, and text in windows of 400,000 characters.
  const std::vector<std::string> ranks = parse_tiktoken_ranks(model_text({"aa", "  "}), "m");
  const Tokenizer whole = Tokenizer::from_tiktoken(ranks, {}, kimi_pretokenizer_pattern());
  const Tokenizer kimi = Tokenizer::from_tiktoken(ranks, {}, kimi_pretokenizer_pattern(),
                                                  {.window_chars = 400'000, .run_chars = 25'000});
  auto cat = [](std::vector<TokenId> a, const std::vector<TokenId>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // "b" + 25,000 a's: 25,001 non-space characters, cut before the last a.
  const std::string text = "b" + std::string(25'000, 'a');
  EXPECT_EQ(whole.encode(text), cat({'b'}, std::vector<TokenId>(12'500, 256)));
  EXPECT_EQ(kimi.encode(text), cat(kimi.encode(text.substr(0, 25'000)), kimi.encode("a")));
  EXPECT_NE(kimi.encode(text), whole.encode(text));
  // A run of 25,000 is not cut; a change of class restarts the count; spaces count alike.
  const std::string at_limit = std::string(25'000, 'a') + " " + std::string(25'000, 'a');
  EXPECT_EQ(kimi.encode(at_limit), whole.encode(at_limit));
  const std::string spaces = "x" + std::string(25'001, ' ') + "y";
  EXPECT_EQ(kimi.encode(spaces), cat(kimi.encode(spaces.substr(0, 25'001)), kimi.encode(spaces.substr(25'001))));
  // Multi-byte characters count once each: 25,001 "é" cut after 25,000 of them (2 bytes each).
  std::string accents;
  for (int i = 0; i < 25'001; ++i) accents += "\xc3\xa9";
  EXPECT_EQ(kimi.encode(accents), cat(kimi.encode(accents.substr(0, 50'000)), kimi.encode(accents.substr(50'000))));
  // Windows of 400,000 characters (classes alternate, so no run is cut): the window ends
  // inside " baaa", which then encodes as " ba" + "aa".
  std::string mixed;
  for (int i = 0; i < 199'999; ++i) mixed += "a ";
  mixed += "baaa";
  EXPECT_EQ(kimi.encode(mixed), cat(kimi.encode(mixed.substr(0, 400'000)), kimi.encode(mixed.substr(400'000))));
  EXPECT_NE(kimi.encode(mixed), whole.encode(mixed));
}

TEST(Tiktoken, LoadsAFolderWithoutTokenizerJson) {
  const auto dir = std::filesystem::temp_directory_path() / ("tetra_tiktoken_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tiktoken.model") << model_text({"hi"});
  nlohmann::json config = {{"tokenizer_class", "TikTokenTokenizer"},
                           {"bos_token", "[BOS]"},
                           {"eos_token", "[EOS]"},
                           {"added_tokens_decoder",
                            {{"257", {{"content", "[BOS]"}, {"special", true}}},
                             {"258", {{"content", "[EOS]"}, {"special", true}}}}}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  std::ofstream(dir / "chat_template.jinja") << "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}";
  Tokenizer t = Tokenizer::load(dir);
  EXPECT_EQ(t.encode("hi"), (std::vector<TokenId>{256}));
  EXPECT_EQ(t.config().eos_token, "[EOS]");
  EXPECT_EQ(t.token_to_id("[EOS]"), 258);
  EXPECT_FALSE(t.config().chat_template.empty());
  // The folder's tokenization_kimi.py, when present, must hold Kimi K2's pat_str.
  const std::string k2_pat_str = R"PY(    pat_str = "|".join(
        [
            r"""[\p{Han}]+""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    ))PY";
  std::ofstream(dir / "tokenization_kimi.py") << k2_pat_str;
  EXPECT_EQ(Tokenizer::load(dir).encode("hi"), (std::vector<TokenId>{256}));
  std::string other = k2_pat_str;
  other.replace(other.find("{1,3}"), 5, "{1,4}");
  std::ofstream(dir / "tokenization_kimi.py") << other;
  try {
    Tokenizer::load(dir);
    ADD_FAILURE() << "accepted another pat_str";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not the one tetra knows"), std::string::npos) << e.what();
  }
  std::filesystem::remove(dir / "tokenization_kimi.py");
  // Another tokenizer class: its pattern is unknown, so the folder is refused with a sentence.
  config["tokenizer_class"] = "SomethingElse";
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  try {
    Tokenizer::load(dir);
    ADD_FAILURE() << "accepted an unknown tokenizer class";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SomethingElse"), std::string::npos) << e.what();
  }
  std::filesystem::remove(dir / "tokenizer_config.json");
  EXPECT_THROW(Tokenizer::load(dir), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tetra::tok
