#include "tokenizer/pretokenizer.h"

#include <algorithm>

#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tetra::tok {

namespace {

// GPT-2's split pattern, which ByteLevel applies when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const nlohmann::json& j, const char* what) {
  TETRA_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "tokenizer.json: ",
              what, " has no type");
  return j["type"].get<std::string>();
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& j) {
  Normalizer n;
  if (j.is_null()) return n;
  std::string type = type_of(j, "a normalizer");
  if (type == "Sequence") {
    TETRA_CHECK(j.contains("normalizers") && j["normalizers"].is_array(),
                "tokenizer.json: normalizer Sequence has no 'normalizers' list");
    for (const auto& sub : j["normalizers"]) {
      Normalizer inner = from_json(sub);
      n.forms_.insert(n.forms_.end(), inner.forms_.begin(), inner.forms_.end());
    }
  } else if (type == "NFC") {
    n.forms_.push_back(Form::NFC);
  } else if (type == "NFD") {
    n.forms_.push_back(Form::NFD);
  } else if (type == "NFKC") {
    n.forms_.push_back(Form::NFKC);
  } else if (type == "NFKD") {
    n.forms_.push_back(Form::NFKD);
  } else {
    fail("tokenizer.json: normalizer '", type, "' is not supported");
  }
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string cur(text);
  for (Form f : forms_) {
    // Code points below U+0300 are unchanged by NFC and NFD and start no composition, so
    // text without a byte >= 0xCC (the lead byte of U+0300) is already in both forms.
    if (f == Form::NFC || f == Form::NFD) {
      bool trivial = true;
      for (unsigned char c : cur)
        if (c >= 0xCC) {
          trivial = false;
          break;
        }
      if (trivial) continue;
    }
    int opts = UTF8PROC_STABLE;
    switch (f) {
      case Form::NFC: opts |= UTF8PROC_COMPOSE; break;
      case Form::NFD: opts |= UTF8PROC_DECOMPOSE; break;
      case Form::NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case Form::NFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* dst = nullptr;
    // An explicit length (no NULLTERM) keeps NUL bytes as ordinary characters.
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()),
                                      static_cast<utf8proc_ssize_t>(cur.size()), &dst,
                                      static_cast<utf8proc_option_t>(opts));
    if (n < 0) fail("normalizer failed: ", utf8proc_errmsg(n));
    cur.assign(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
    free(dst);
  }
  return cur;
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  if (!j.is_null()) p.add_json(j);
  return p;
}

void PreTokenizer::add_json(const nlohmann::json& j) {
  std::string type = type_of(j, "a pre_tokenizer");
  if (type == "Sequence") {
    TETRA_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(),
                "tokenizer.json: pre_tokenizer Sequence has no 'pretokenizers' list");
    for (const auto& sub : j["pretokenizers"]) add_json(sub);
  } else if (type == "Split") {
    const auto& pat = j.at("pattern");
    bool literal = pat.contains("String");
    TETRA_CHECK(literal || pat.contains("Regex"), "tokenizer.json: Split has no pattern");
    std::string text = literal ? pat["String"].get<std::string>() : pat["Regex"].get<std::string>();
    std::string b = j.value("behavior", std::string("Isolated"));
    Behavior behavior;
    if (b == "Removed") behavior = Behavior::Removed;
    else if (b == "Isolated") behavior = Behavior::Isolated;
    else if (b == "MergedWithPrevious") behavior = Behavior::MergedWithPrevious;
    else if (b == "MergedWithNext") behavior = Behavior::MergedWithNext;
    else if (b == "Contiguous") behavior = Behavior::Contiguous;
    else fail("tokenizer.json: Split behavior '", b, "' is not supported");
    steps_.push_back({Regex(text, literal), behavior, j.value("invert", false)});
  } else if (type == "ByteLevel") {
    // The byte-to-character mapping itself happens in the BPE model, which works on bytes.
    TETRA_CHECK(!j.value("add_prefix_space", false),
                "tokenizer.json: ByteLevel add_prefix_space=true is not supported");
    if (j.value("use_regex", true))
      steps_.push_back({Regex(kGpt2Pattern, false), Behavior::Isolated, false});
  } else {
    fail("tokenizer.json: pre_tokenizer '", type, "' is not supported");
  }
}

void PreTokenizer::split(std::string_view text, std::vector<Span>& out) const {
  std::vector<Span> cur{{0, text.size()}}, next, matches;
  std::vector<std::pair<Span, bool>> parts;  // (span, is_match) covering one piece
  for (const Step& step : steps_) {
    next.clear();
    for (Span piece : cur) {
      std::string_view sub = text.substr(piece.first, piece.second - piece.first);
      matches.clear();
      step.regex.find_all(sub, matches);
      if (step.behavior == Behavior::Isolated) {  // the common case: every match is a piece
        size_t prev = 0;
        for (auto [b, e] : matches) {
          if (prev < b) next.push_back({piece.first + prev, piece.first + b});
          if (e > b) next.push_back({piece.first + b, piece.first + e});
          prev = e;
        }
        if (prev < sub.size()) next.push_back({piece.first + prev, piece.second});
        continue;
      }
      parts.clear();
      size_t prev = 0;
      for (auto [b, e] : matches) {
        if (prev < b) parts.push_back({{prev, b}, step.invert});
        parts.push_back({{b, e}, !step.invert});
        prev = e;
      }
      if (prev < sub.size()) parts.push_back({{prev, sub.size()}, step.invert});
      // Fold matches into pieces per the delimiter behavior (HF SplitDelimiterBehavior).
      std::vector<std::pair<Span, bool>> folded;
      bool prev_match = false;
      switch (step.behavior) {
        case Behavior::Isolated: break;
        case Behavior::Removed:
          for (auto& p : parts)
            if (!p.second) folded.push_back(p);
          break;
        case Behavior::MergedWithPrevious:
          for (auto& p : parts) {
            if (p.second && !prev_match && !folded.empty()) folded.back().first.second = p.first.second;
            else folded.push_back(p);
            prev_match = p.second;
          }
          break;
        case Behavior::MergedWithNext:
          for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
            if (it->second && !prev_match && !folded.empty()) folded.back().first.first = it->first.first;
            else folded.push_back(*it);
            prev_match = it->second;
          }
          std::reverse(folded.begin(), folded.end());
          break;
        case Behavior::Contiguous:
          for (auto& p : parts) {
            if (p.second == prev_match && !folded.empty()) folded.back().first.second = p.first.second;
            else folded.push_back(p);
            prev_match = p.second;
          }
          break;
      }
      for (auto& [span, is_match] : folded)
        if (span.second > span.first)
          next.push_back({piece.first + span.first, piece.first + span.second});
    }
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

}  // namespace tetra::tok
