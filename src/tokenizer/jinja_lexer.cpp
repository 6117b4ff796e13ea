#include "tokenizer/jinja_lexer.h"

#include <cctype>

#include "core/error.h"
#include "tokenizer/jinja_value.h"
#include "tokenizer/utf8.h"

namespace tetra::tok::jinja {

namespace {

// Python's str.splitlines() boundaries, which Jinja2 turns into "\n" before lexing.
std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  size_t i = 0;
  while (i < src.size()) {
    unsigned char c = static_cast<unsigned char>(src[i]);
    if (c == '\r') {
      out += '\n';
      i += (i + 1 < src.size() && src[i + 1] == '\n') ? 2 : 1;
    } else if (c == '\n' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E)) {
      out += '\n';
      ++i;
    } else if (c == 0xC2 && i + 1 < src.size() && static_cast<unsigned char>(src[i + 1]) == 0x85) {
      out += '\n';
      i += 2;
    } else if (c == 0xE2 && i + 2 < src.size() && static_cast<unsigned char>(src[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(src[i + 2]) == 0xA8 || static_cast<unsigned char>(src[i + 2]) == 0xA9)) {
      out += '\n';
      i += 3;
    } else {
      out += static_cast<char>(c);
      ++i;
    }
  }
  // keep_trailing_newline=False: one final newline is dropped.
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

size_t skip_py_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t j = i;
    if (!py_isspace(utf8_next(s, j))) break;  // ill-formed bytes read as U+FFFD: not space
    i = j;
  }
  return i;
}

std::string rstrip_py_space(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    size_t k = b;
    if (!py_isspace(utf8_next(s, k))) break;
    end = b;
  }
  return std::string(s.substr(0, end));
}

// Python's "unicode-escape" decoding of a string literal's body.
std::string unescape(std::string_view body, int line) {
  std::string out;
  size_t i = 0;
  auto hex = [&](size_t n) -> char32_t {
    TETRA_CHECK(i + n <= body.size(), "chat template line ", line, ": truncated escape in a string");
    char32_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      char c = body[i + k];
      int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      TETRA_CHECK(d >= 0, "chat template line ", line, ": bad escape in a string");
      v = v * 16 + static_cast<char32_t>(d);
    }
    i += n;
    return v;
  };
  while (i < body.size()) {
    char c = body[i++];
    if (c != '\\' || i >= body.size()) {
      out += c;
      continue;
    }
    char e = body[i++];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // line continuation
      case 'x': utf8_append(out, hex(2)); break;
      case 'u': {
        char32_t cp = hex(4);
        utf8_append(out, cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFD : cp);
        break;
      }
      case 'U': {
        char32_t cp = hex(8);
        TETRA_CHECK(cp <= 0x10FFFF, "chat template line ", line, ": escape beyond U+10FFFF");
        utf8_append(out, cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFD : cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k)
            v = v * 8 + static_cast<char32_t>(body[i++] - '0');
          utf8_append(out, v);
        } else {
          out += '\\';  // unknown escapes stay as written
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t t = s_.find('{', pos_);
      while (t != std::string::npos && !(t + 1 < s_.size() && (s_[t + 1] == '{' || s_[t + 1] == '%' || s_[t + 1] == '#')))
        t = s_.find('{', t + 1);
      if (t == std::string::npos) {
        data(s_.substr(pos_));
        break;
      }
      std::string text = s_.substr(pos_, t - pos_);
      char kind = s_[t + 1];
      char marker = t + 2 < s_.size() ? s_[t + 2] : 0;
      if (marker == '-') {
        text = rstrip_py_space(text);
      } else if (kind != '{' && marker != '+') {
        // lstrip_blocks: spaces and tabs between a line start and a block or comment go.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          if (text.find_first_not_of(" \t", l_pos) == std::string::npos) text.resize(l_pos);
        }
      }
      data(text);
      pos_ = t + 2 + ((marker == '-' || marker == '+') ? 1 : 0);
      if (kind == '#') {
        size_t end = s_.find("#}", pos_);
        TETRA_CHECK(end != std::string::npos, "chat template line ", line_, ": unclosed comment");
        bool strip = end > pos_ && s_[end - 1] == '-';
        advance_to(end + 2);
        line_starting = tag_end(strip, true);
      } else if (kind == '%' && is_raw()) {
        line_starting = raw();
      } else {
        line_starting = tag(kind == '{');
      }
    }
    out_.push_back({TokenKind::End, "", line_});
    return std::move(out_);
  }

 private:
  void data(const std::string& text) {
    if (!text.empty()) out_.push_back({TokenKind::Data, text, line_});
    for (char c : text) line_ += c == '\n';
  }

  void advance_to(size_t p) {
    for (size_t k = pos_; k < p && k < s_.size(); ++k) line_ += s_[k] == '\n';
    pos_ = p;
  }

  // After a closing delimiter: "-" strips all following whitespace; trim_blocks drops one
  // newline after a block or comment. Returns whether the consumed text ended a line.
  bool tag_end(bool strip, bool block) {
    bool ended_line = false;
    if (strip) {
      size_t p = skip_py_space(s_, pos_);
      ended_line = p > pos_ && s_[p - 1] == '\n';
      advance_to(p);
    } else if (block && pos_ < s_.size() && s_[pos_] == '\n') {
      advance_to(pos_ + 1);
      ended_line = true;
    }
    return ended_line;
  }

  bool is_raw() {
    size_t p = pos_;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n')) ++p;
    return s_.compare(p, 3, "raw") == 0 && p + 3 < s_.size() && !std::isalnum(static_cast<unsigned char>(s_[p + 3])) && s_[p + 3] != '_';
  }

  bool raw() {
    size_t close = s_.find("%}", pos_);
    TETRA_CHECK(close != std::string::npos, "chat template line ", line_, ": unclosed raw tag");
    bool strip_after_open = s_[close - 1] == '-';
    advance_to(close + 2);
    if (strip_after_open) advance_to(skip_py_space(s_, pos_));
    else tag_end(false, true);
    // The body runs to the next {% endraw %}.
    size_t search = pos_;
    while (true) {
      size_t open = s_.find("{%", search);
      TETRA_CHECK(open != std::string::npos, "chat template line ", line_, ": raw block without endraw");
      size_t p = open + 2;
      bool strip_before = p < s_.size() && s_[p] == '-';
      if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n')) ++p;
      if (s_.compare(p, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      p += 6;
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n')) ++p;
      bool strip_after = p < s_.size() && s_[p] == '-';
      if (strip_after) ++p;
      TETRA_CHECK(s_.compare(p, 2, "%}") == 0, "chat template line ", line_, ": malformed endraw");
      std::string body = s_.substr(pos_, open - pos_);
      if (strip_before) body = rstrip_py_space(body);
      data(body);
      pos_ = open;
      advance_to(p + 2);
      return tag_end(strip_after, true);
    }
  }

  bool tag(bool variable) {
    out_.push_back({variable ? TokenKind::VarBegin : TokenKind::BlockBegin, "", line_});
    int depth = 0;  // brackets open inside the tag: a closing delimiter only counts at 0
    const char* close = variable ? "}}" : "%}";
    while (true) {
      TETRA_CHECK(pos_ < s_.size(), "chat template line ", line_, ": tag is not closed");
      char c = s_[pos_];
      if (depth == 0) {
        bool strip = c == '-' && s_.compare(pos_ + 1, 2, close) == 0;
        bool plus = !variable && c == '+' && s_.compare(pos_ + 1, 2, close) == 0;  // no trim_blocks
        if (strip || plus || s_.compare(pos_, 2, close) == 0) {
          advance_to(pos_ + (strip || plus ? 3 : 2));
          out_.push_back({variable ? TokenKind::VarEnd : TokenKind::BlockEnd, "", line_});
          return tag_end(strip, !variable && !plus);
        }
      }
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance_to(pos_ + 1);
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        out_.push_back({TokenKind::Name, s_.substr(pos_, e - pos_), line_});
        pos_ = e;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = pos_ + 1;
        while (e < s_.size() && s_[e] != c) e += s_[e] == '\\' ? 2 : 1;
        TETRA_CHECK(e < s_.size(), "chat template line ", line_, ": unterminated string");
        out_.push_back({TokenKind::String, unescape(std::string_view(s_).substr(pos_ + 1, e - pos_ - 1), line_), line_});
        advance_to(e + 1);
        continue;
      }
      static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                         "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
      bool matched = false;
      for (const char* op : kOps) {
        size_t n = std::char_traits<char>::length(op);
        if (s_.compare(pos_, n, op) == 0) {
          if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
          if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
          out_.push_back({TokenKind::Op, op, line_});
          pos_ += n;
          matched = true;
          break;
        }
      }
      TETRA_CHECK(matched, "chat template line ", line_, ": unexpected character '", std::string(1, c), "'");
    }
  }

  void number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    // A number right after "." is an index (a.0.b), never a float.
    bool after_dot = pos_ > 0 && s_[pos_ - 1] == '.';
    if (!after_dot && e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      ++e;
      digits();
      is_float = true;
    }
    if (!after_dot && e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t k = e + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
        e = k;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = pos_; k < e; ++k)
      if (s_[k] != '_') text += s_[k];
    out_.push_back({is_float ? TokenKind::Float : TokenKind::Int, text, line_});
    pos_ = e;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace tetra::tok::jinja
