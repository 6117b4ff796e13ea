// tiktoken.model: each line is the base64 of a token's bytes, a space, and its rank; the rank
// is both the token id and the merge priority. Encoding splits text with the pattern, then in
// each piece repeatedly merges the adjacent pair whose concatenated bytes have the lowest rank
// (leftmost on ties). That is HF BPE with one merge (left, right) -> rank(left+right) for every
// split of every token into two tokens, which is how BpeModel::from_ranks builds its table.
#include "tokenizer/tiktoken.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/file_text.h"
#include "tokenizer/tokenizer.h"

namespace tetra::tok {
namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with '=' padding; false on any other character or a bad length.
bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') ++pad;
  if (in.size() >= 2 && in[in.size() - 2] == '=') ++pad;
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      const bool tail_pad = c == '=' && i + 4 == in.size() && k >= 4 - pad;
      const int d = tail_pad ? 0 : base64_value(c);
      if (d < 0) return false;
      v = (v << 6) | uint32_t(d);
    }
    out += char(v >> 16);
    if (!(i + 4 == in.size() && pad >= 2)) out += char((v >> 8) & 0xff);
    if (!(i + 4 == in.size() && pad >= 1)) out += char(v & 0xff);
  }
  return true;
}

}  // namespace

std::vector<std::string> parse_tiktoken_ranks(std::string_view text, const std::string& source) {
  std::vector<std::string> by_rank;
  std::vector<uint8_t> seen;
  std::unordered_map<std::string, uint32_t> rank_of;
  // Dense ranks are below the number of lines: a larger one is refused before it could size
  // any table (one line claiming rank 10^9 must not allocate a billion entries).
  const size_t n_lines = size_t(std::count(text.begin(), text.end(), '\n')) + 1;
  size_t line_no = 0, pos = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    TETRA_CHECK(sp != std::string_view::npos && line.find(' ', sp + 1) == std::string_view::npos, source,
                " line ", line_no, ": expected '<base64> <rank>'");
    TETRA_CHECK(base64_decode(line.substr(0, sp), bytes), source, " line ", line_no, ": '",
                std::string(line.substr(0, std::min<size_t>(sp, 64))), "' is not base64");
    // Building the merges costs the square of a token's length; real tokens are at most a few
    // hundred bytes (o200k_base: 128).
    constexpr size_t kMaxTokenBytes = 4096;
    TETRA_CHECK(bytes.size() <= kMaxTokenBytes, source, " line ", line_no, ": a token of ", bytes.size(),
                " bytes is longer than ", kMaxTokenBytes);
    const std::string_view rank_text = line.substr(sp + 1);
    uint64_t rank = 0;
    TETRA_CHECK(!rank_text.empty() && rank_text.size() <= 10, source, " line ", line_no, ": bad rank");
    for (char c : rank_text) {
      TETRA_CHECK(c >= '0' && c <= '9', source, " line ", line_no, ": rank '", std::string(rank_text),
                  "' is not a number");
      rank = rank * 10 + uint64_t(c - '0');
    }
    TETRA_CHECK(rank < (1u << 30) && rank < n_lines, source, " line ", line_no, ": rank ", rank,
                " is out of range (the file has ", n_lines, " lines)");
    if (rank >= by_rank.size()) {
      by_rank.resize(rank + 1);
      seen.resize(rank + 1, 0);
    }
    TETRA_CHECK(!seen[rank], source, " line ", line_no, ": rank ", rank, " appears twice");
    TETRA_CHECK(rank_of.emplace(bytes, uint32_t(rank)).second, source, " line ", line_no,
                ": the same bytes appear twice (ranks ", rank_of[bytes], " and ", rank, ")");
    seen[rank] = 1;
    by_rank[rank] = bytes;
  }
  TETRA_CHECK(!by_rank.empty(), source, " has no tokens");
  for (size_t r = 0; r < seen.size(); ++r)
    TETRA_CHECK(seen[r], source, ": rank ", r, " is missing (ranks must be 0..", by_rank.size() - 1, ")");
  for (int b = 0; b < 256; ++b)
    TETRA_CHECK(rank_of.count(std::string(1, char(b))), source, ": the single byte ", b,
                " is not a token, so some text could not be encoded");
  return by_rank;
}

// tokenization_kimi.py's pat_str, alternative by alternative, as its source writes them.
constexpr const char* kKimiPatStrParts[] = {
    R"([\p{Han}]+)",
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)",
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)",
    R"(\p{N}{1,3})",
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*)",
    R"(\s*[\r\n]+)",
    R"(\s+(?!\S))",
};

const std::string& kimi_pretokenizer_pattern() {
  // tiktoken's \p{Han} is the Script property, while PCRE2's is Script_Extensions (which adds
  // CJK punctuation such as 』); PCRE2 10.42 knows Unicode 14, so the Han extensions of
  // Unicode 15 (H) and 15.1 (I) are added by range.
  static const std::string han = R"([\p{sc=Han}\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF}])";
  // Not-Han letter classes: tiktoken's regex writes them as [\p{Lu}...&&[^\p{Han}]].
  static const std::string upper = "(?:(?!" + han + R"()[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))";
  static const std::string lower = "(?:(?!" + han + R"()[\p{Ll}\p{Lm}\p{Lo}\p{M}]))";
  static const std::string suffix = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)";
  static const std::string pattern = han + "+" +                                           //
                                     "|" + R"([^\r\n\p{L}\p{N}]?)" + upper + "*" + lower + "+" + suffix +  //
                                     "|" + R"([^\r\n\p{L}\p{N}]?)" + upper + "+" + lower + "*" + suffix +  //
                                     "|" + R"(\p{N}{1,3})" +                                //
                                     "|" + R"( ?[^\s\p{L}\p{N}]+[\r\n]*)" +                 //
                                     "|" + R"(\s*[\r\n]+)" +                                //
                                     "|" + R"(\s+(?!\S))" +                                 //
                                     "|" + R"(\s+)";
  return pattern;
}

std::vector<AddedToken> kimi_special_tokens(const nlohmann::json& config, size_t n_base, const std::string& source) {
  constexpr size_t kReserved = 256;  // tokenization_kimi.py's num_reserved_special_tokens
  std::map<size_t, AddedToken> by_id;
  for (size_t id = n_base; id < n_base + kReserved; ++id)
    by_id[id] = AddedToken{.id = TokenId(id), .content = "<|reserved_token_" + std::to_string(id) + "|>",
                           .special = true};
  if (config.is_object() && config.contains("added_tokens_decoder")) {
    const nlohmann::json& dec = config["added_tokens_decoder"];
    TETRA_CHECK(dec.is_object(), source, ": added_tokens_decoder is not an object");
    for (auto it = dec.begin(); it != dec.end(); ++it) {
      size_t id = 0;
      try {
        size_t used = 0;
        id = std::stoul(it.key(), &used);
        TETRA_CHECK(used == it.key().size(), "");
      } catch (const std::exception&) {
        fail(source, ": added_tokens_decoder key '", it.key(), "' is not a token id");
      }
      TETRA_CHECK(id >= n_base && id < n_base + kReserved + 16, source, ": added token id ", id,
                  " is outside the special range [", n_base, ", ", n_base + kReserved + 16, ")");
      const nlohmann::json& v = it.value();
      TETRA_CHECK(v.is_object() && v.contains("content") && v["content"].is_string() &&
                      !v["content"].get_ref<const std::string&>().empty(),
                  source, ": added token ", id, " has no content");
      AddedToken t{.id = TokenId(id), .content = v["content"].get<std::string>(), .special = true};
      // tiktoken matches special tokens exactly: no stripping, no word boundaries.
      if (v.contains("special") && v["special"].is_boolean()) t.special = v["special"].get<bool>();
      by_id[id] = std::move(t);
    }
  }
  std::vector<AddedToken> out;
  for (auto& [id, t] : by_id) out.push_back(std::move(t));
  return out;
}

Tokenizer load_tiktoken_tokenizer(const std::filesystem::path& dir) {
  const std::filesystem::path model_path = dir / "tiktoken.model";
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  TETRA_CHECK(std::filesystem::is_regular_file(config_path), "model folder ", dir.string(),
              " has tiktoken.model but no tokenizer_config.json to name its special tokens");
  const std::string config_text = read_file(config_path);
  nlohmann::json config = nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  TETRA_CHECK(config.is_object(), config_path.string(), " is not a JSON object");
  // The pattern is code, not data: accept only the tokenizer whose pattern we know.
  std::string cls = config.value("tokenizer_class", std::string());
  bool kimi = cls == "TikTokenTokenizer";
  if (auto am = config.find("auto_map"); am != config.end() && am->is_object() && am->contains("AutoTokenizer"))
    kimi = kimi || (*am)["AutoTokenizer"].dump().find("tokenization_kimi") != std::string::npos;
  TETRA_CHECK(kimi, config_path.string(), " names tokenizer class '", cls,
              "'; tiktoken.model is only supported for Kimi's TikTokenTokenizer (its pre-tokenizer is known)");
  // The folder's own tokenization_kimi.py, when shipped, must hold the pattern used here: a
  // later Kimi with another pat_str is refused rather than tokenized wrongly.
  if (const auto py = dir / "tokenization_kimi.py"; std::filesystem::is_regular_file(py)) {
    const std::string code = read_file(py);
    for (const char* part : kKimiPatStrParts)
      TETRA_CHECK(code.find(part) != std::string::npos, py.string(), " has a pat_str without Kimi K2's '", part,
                  "'; its pre-tokenizer is not the one tetra knows");
  }
  std::vector<std::string> ranks = parse_tiktoken_ranks(read_file(model_path), model_path.string());
  std::vector<AddedToken> specials = kimi_special_tokens(config, ranks.size(), config_path.string());
  // tokenization_kimi.py: TIKTOKEN_MAX_ENCODE_CHARS and MAX_NO_WHITESPACES_CHARS.
  Tokenizer t = Tokenizer::from_tiktoken(ranks, std::move(specials), kimi_pretokenizer_pattern(),
                                         {.window_chars = 400'000, .run_chars = 25'000});
  TokenizerConfig tc = parse_tokenizer_config(config_text, config_path.string());
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja_path)) tc.chat_template = read_file(jinja_path);
  t.set_config(std::move(tc));
  return t;
}

}  // namespace tetra::tok
