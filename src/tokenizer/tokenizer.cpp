#include "tokenizer/tokenizer.h"

#include <array>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/file_text.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/utf8.h"

namespace tetra::tok {

namespace {

constexpr uint8_t kKnown = 1, kSpecial = 2;

// Pieces at most this long are cached: they are words, which repeat; longer ones rarely do.
constexpr size_t kCachedPieceBytes = 64;

// The bytes the ByteLevel decoder gives for one token string: each character mapped back to
// its byte, or, if any character is outside the byte table (an added token such as
// "<｜begin▁of▁sentence｜>"), the token's own UTF-8 bytes, as HF's decoder does.
std::string byte_level_decode(std::string_view token) {
  const ByteLevelTable& table = byte_level_table();
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    int b = table.byte_of(utf8_next(token, i));  // ill-formed bytes read as U+FFFD: not in the table
    if (b < 0) return std::string(token);
    out += static_cast<char>(b);
  }
  return out;
}

}  // namespace

// Word -> ids, sharded so that threads encoding at once rarely wait on the same lock.
struct Tokenizer::WordCache {
  static constexpr size_t kShards = 64, kShardEntries = 8192;
  // Transparent hashing: lookups by string_view allocate nothing.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<TokenId>, Hash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards;
};

Tokenizer::Tokenizer() : cache_(std::make_unique<WordCache>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& source) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(source, " is not valid JSON (", e.what(), ")");
  }
  TETRA_CHECK(j.is_object(), source, " is not a JSON object");
  try {
    for (const char* key : {"truncation", "padding"})
      TETRA_CHECK(!j.contains(key) || j[key].is_null(), source, ": '", key,
                  "' is set, which this engine does not support");
    Tokenizer t;
    t.bpe_ = BpeModel::from_json(j.at("model"));
    t.normalizer_ = Normalizer::from_json(j.value("normalizer", json()));
    t.pre_tokenizer_ = PreTokenizer::from_json(j.value("pre_tokenizer", json()));
    json decoder = j.value("decoder", json());
    TETRA_CHECK(decoder.is_object() && decoder.value("type", std::string()) == "ByteLevel",
                source, ": decoder ", decoder.dump(), " is not supported (only ByteLevel is)");

    size_t n_ids = static_cast<size_t>(t.bpe_.max_id() + 1);
    if (j.contains("added_tokens")) {
      TETRA_CHECK(j["added_tokens"].is_array(), source, ": added_tokens is not an array");
      for (const json& a : j["added_tokens"]) {
        AddedToken tok;
        int64_t id = a.at("id").get<int64_t>();
        TETRA_CHECK(id >= 0 && id < (1 << 30), source, ": added token id ", id, " is out of range");
        tok.id = static_cast<TokenId>(id);
        tok.content = a.at("content").get<std::string>();
        TETRA_CHECK(!tok.content.empty() && utf8_is_valid(tok.content), source,
                    ": added token ", id, " has empty or invalid content");
        tok.special = a.value("special", false);
        tok.lstrip = a.value("lstrip", false);
        tok.rstrip = a.value("rstrip", false);
        tok.single_word = a.value("single_word", false);
        tok.normalized = a.value("normalized", !tok.special);
        n_ids = std::max(n_ids, static_cast<size_t>(id) + 1);
        t.added_.push_back(std::move(tok));
      }
    }
    t.index_tokens(n_ids);
    t.post_processor_ = parse_post_processor(j.value("post_processor", json()), source);
    for (const auto* ids : {&t.post_processor_.prefix, &t.post_processor_.suffix})
      for (TokenId id : *ids)
        TETRA_CHECK(id >= 0 && size_t(id) < n_ids && t.id_flags_[size_t(id)], source,
                    ": post_processor adds token id ", id, ", which the vocabulary lacks");
    t.wrap_ = t.post_processor_;
    return t;
  } catch (const json::exception& e) {
    fail(source, " has an unexpected structure (", e.what(), ")");
  }
}

void Tokenizer::index_tokens(size_t n_ids) {
  id_to_token_.assign(n_ids, std::string());
  id_bytes_.assign(n_ids, std::string());
  id_flags_.assign(n_ids, 0);
  for (const auto& [token, id] : bpe_.vocab()) {
    id_to_token_[id] = token;
    id_flags_[id] = kKnown;
  }
  for (size_t k = 0; k < added_.size(); ++k) {
    const AddedToken& a = added_[k];
    id_to_token_[a.id] = a.content;
    id_flags_[a.id] = kKnown | (a.special ? kSpecial : 0);
    if (a.normalized)
      normalized_matcher_.add(normalizer_.apply(a.content), static_cast<int>(k));
    else
      raw_matcher_.add(a.content, static_cast<int>(k));
  }
  for (size_t id = 0; id < n_ids; ++id)
    if (id_flags_[id]) id_bytes_[id] = byte_level_decode(id_to_token_[id]);
}

Tokenizer Tokenizer::from_tiktoken(const std::vector<std::string>& rank_bytes, std::vector<AddedToken> specials,
                                   const std::string& pattern, TextChunking chunking) {
  Tokenizer t;
  t.chunking_ = chunking;
  t.bpe_ = BpeModel::from_ranks(rank_bytes);
  t.pre_tokenizer_ = PreTokenizer::from_json(
      {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}});
  size_t n_ids = rank_bytes.size();
  for (AddedToken& a : specials) {
    TETRA_CHECK(a.id >= TokenId(rank_bytes.size()) && a.id < (1 << 30) && !a.content.empty() &&
                    utf8_is_valid(a.content),
                "special token ", a.id, " overlaps the ranks or has empty or invalid content");
    a.normalized = a.lstrip = a.rstrip = a.single_word = false;
    n_ids = std::max(n_ids, size_t(a.id) + 1);
  }
  t.added_ = std::move(specials);
  t.index_tokens(n_ids);
  return t;
}

TokenizerConfig parse_tokenizer_config(std::string_view text, const std::string& source) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(source, " is not valid JSON (", e.what(), ")");
  }
  TETRA_CHECK(j.is_object(), source, " is not a JSON object");
  TokenizerConfig c;
  // Special tokens are written either as a string or as an AddedToken dict.
  auto token = [&](const char* key) -> std::optional<std::string> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    const json& v = j[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      return v["content"].get<std::string>();
    fail(source, ": '", key, "' is neither a string nor a token object");
  };
  c.bos_token = token("bos_token");
  c.eos_token = token("eos_token");
  for (auto [key, field] : {std::pair{"add_bos_token", &c.add_bos_token}, std::pair{"add_eos_token", &c.add_eos_token}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    TETRA_CHECK(j[key].is_boolean(), source, ": '", key, "' must be true or false");
    *field = j[key].get<bool>();
  }
  if (j.contains("chat_template")) {
    const json& t = j["chat_template"];
    if (t.is_string()) {
      c.chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      // A list of named templates: the one called "default" is the chat template.
      for (const json& e : t)
        if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") &&
            e["template"].is_string())
          c.chat_template = e["template"].get<std::string>();
    } else if (!t.is_null()) {
      fail(source, ": 'chat_template' is neither a string nor a list of templates");
    }
  }
  return c;
}

bool has_tokenizer(const std::filesystem::path& dir) {
  return std::filesystem::is_regular_file(dir / "tokenizer.json") || std::filesystem::is_regular_file(dir / "tiktoken.model");
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  std::filesystem::path json_path = dir / "tokenizer.json";
  if (!std::filesystem::exists(json_path) && std::filesystem::is_regular_file(dir / "tiktoken.model"))
    return load_tiktoken_tokenizer(dir);
  TETRA_CHECK(std::filesystem::is_regular_file(json_path), "model folder ", dir.string(),
              " has no tokenizer.json (nor tiktoken.model)");
  Tokenizer t = from_json(read_file(json_path), json_path.string());
  std::filesystem::path config_path = dir / "tokenizer_config.json";
  TokenizerConfig config;
  if (std::filesystem::is_regular_file(config_path))
    config = parse_tokenizer_config(read_file(config_path), config_path.string());
  std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja_path)) config.chat_template = read_file(jinja_path);
  t.set_config(std::move(config));
  return t;
}

void Tokenizer::set_config(TokenizerConfig config) {
  config_ = std::move(config);
  wrap_ = post_processor_;
  // add_bos_token / add_eos_token, where set, decide BOS and EOS (DeepSeek-V3 ships a
  // ByteLevel post_processor and add_bos_token: true; HF prepends BOS).
  auto apply = [&](const std::optional<bool>& add, const std::optional<std::string>& token,
                   std::vector<TokenId>& ids, bool at_front) {
    if (!add || !token) return;
    const std::optional<TokenId> id = token_to_id(*token);
    if (!id) return;
    const bool has = !ids.empty() && (at_front ? ids.front() : ids.back()) == *id;
    if (*add && !has) ids.insert(at_front ? ids.begin() : ids.end(), *id);
    if (!*add && has) ids.erase(at_front ? ids.begin() : ids.end() - 1);
  };
  apply(config_.add_bos_token, config_.bos_token, wrap_.prefix, true);
  apply(config_.add_eos_token, config_.eos_token, wrap_.suffix, false);
}

namespace {

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool python_isspace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680) return true;
  if ((c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000)
    return true;
  return false;
}

}  // namespace

std::vector<size_t> Tokenizer::chunk_cuts(std::string_view text) const {
  std::vector<size_t> cuts;
  if (chunking_.window_chars == 0 && chunking_.run_chars == 0) return cuts;
  size_t i = 0, n_chars = 0, run = 0;
  bool run_is_space = false;
  while (i < text.size()) {
    const size_t at = i;
    const bool space = python_isspace(utf8_next(text, i));
    if (chunking_.window_chars && n_chars % chunking_.window_chars == 0) {
      if (n_chars > 0) cuts.push_back(at);
      run_is_space = space;  // a window starts a fresh run count
      run = 0;
    }
    ++n_chars;
    if (space != run_is_space) {
      run_is_space = space;
      run = 1;
    } else if (++run > chunking_.run_chars && chunking_.run_chars) {
      if (cuts.empty() || cuts.back() != at) cuts.push_back(at);
      run = 1;
    }
  }
  return cuts;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, EncodeOptions options) const {
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = utf8_sanitize(text);
    text = repaired;
  }
  std::vector<TokenId> out;
  if (options.add_special_tokens) out = wrap_.prefix;
  out.reserve(out.size() + text.size() / 3 + 1);
  std::vector<Section> sections;
  if (raw_matcher_.empty())
    sections.push_back({0, text.size(), -1});
  else
    raw_matcher_.split(text, added_, options.parse_special, sections);
  if (const std::vector<size_t> cuts = chunk_cuts(text); !cuts.empty()) {
    std::vector<Section> cut;
    size_t k = 0;
    for (const Section& s : sections) {
      while (k < cuts.size() && cuts[k] <= s.begin) ++k;
      if (s.token >= 0) {
        cut.push_back(s);
        continue;
      }
      size_t begin = s.begin;
      for (; k < cuts.size() && cuts[k] < s.end; ++k) {
        cut.push_back({begin, cuts[k], -1});
        begin = cuts[k];
      }
      cut.push_back({begin, s.end, -1});
    }
    sections = std::move(cut);
  }
  std::vector<Section> inner;
  for (const Section& s : sections) {
    if (s.token >= 0) {
      out.push_back(s.token);
      continue;
    }
    std::string_view plain = text.substr(s.begin, s.end - s.begin);
    std::string normalized;
    if (!normalizer_.is_identity()) {
      normalized = normalizer_.apply(plain);
      plain = normalized;
    }
    if (normalized_matcher_.empty()) {
      encode_normalized(plain, out);
      continue;
    }
    inner.clear();
    normalized_matcher_.split(plain, added_, options.parse_special, inner);
    for (const Section& n : inner) {
      if (n.token >= 0)
        out.push_back(n.token);
      else
        encode_normalized(plain.substr(n.begin, n.end - n.begin), out);
    }
  }
  if (options.add_special_tokens) out.insert(out.end(), wrap_.suffix.begin(), wrap_.suffix.end());
  return out;
}

void Tokenizer::encode_normalized(std::string_view text, std::vector<TokenId>& out) const {
  std::vector<Span> pieces;
  pre_tokenizer_.split(text, pieces);
  for (auto [b, e] : pieces) {
    std::string_view piece = text.substr(b, e - b);
    if (piece.size() > kCachedPieceBytes) {
      bpe_.encode_piece(piece, out);
      continue;
    }
    size_t h = WordCache::Hash{}(piece);
    // High bits pick the shard; the map itself uses the low bits.
    WordCache::Shard& shard = cache_->shards[(h >> 48) % WordCache::kShards];
    {
      std::lock_guard<std::mutex> lock(shard.mu);
      auto it = shard.map.find(piece);
      if (it != shard.map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    size_t first = out.size();
    bpe_.encode_piece(piece, out);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= WordCache::kShardEntries) shard.map.clear();  // bounded memory
    shard.map.emplace(std::string(piece), std::vector<TokenId>(out.begin() + first, out.end()));
  }
}

std::string Tokenizer::decode(std::span<const TokenId> ids, DecodeOptions options) const {
  std::string bytes;
  for (TokenId id : ids) {
    TETRA_CHECK(id >= 0, "token id ", id, " is negative");
    // HF skips ids without a token (the embedding table is padded past the vocabulary).
    if (static_cast<size_t>(id) >= id_flags_.size() || !id_flags_[id]) continue;
    if (options.skip_special && (id_flags_[id] & kSpecial)) continue;
    bytes += id_bytes_[id];
  }
  return utf8_is_valid(bytes) ? bytes : utf8_sanitize(bytes);
}

std::optional<std::string_view> Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_flags_.size() || !id_flags_[id]) return std::nullopt;
  return std::string_view(id_bytes_[id]);
}

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_flags_.size() || !id_flags_[id]) return std::nullopt;
  return std::string_view(id_to_token_[id]);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  auto it = bpe_.vocab().find(std::string(token));
  if (it != bpe_.vocab().end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < id_flags_.size() && (id_flags_[id] & kSpecial);
}

}  // namespace tetra::tok
