#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <string_view>

#include "core/error.h"

namespace tetra::tok {

namespace {

// Backtracking steps allowed per match attempt. Real pre-tokenizer patterns need a few per
// character; a catastrophic pattern needs millions.
constexpr uint32_t kMatchLimit = 10'000'000;

struct DeltaRange {
  char32_t first, last;
  const char* category;
};
constexpr DeltaRange kUnicodeDelta[] = {
#include "tokenizer/unicode_delta.inc"
};

// PCRE2 10.42 knows Unicode 14; HF's Oniguruma knows Unicode 16. Each \p{X} of a general
// category gets the code points assigned since then (U+1FABF, a Unicode 15 emoji, must be
// \p{S} as in HF), inside a class as extra ranges, outside as a new class.
std::string widen_unicode_classes(const std::string& pat) {
  std::string out;
  bool in_class = false;
  size_t i = 0;
  auto ranges_for = [](std::string_view cat) {
    std::string r;
    char buf[48];
    for (const DeltaRange& d : kUnicodeDelta) {
      std::string_view c = d.category;
      if (cat.size() == 1 ? c[0] != cat[0] : c != cat) continue;
      std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(d.first), static_cast<unsigned>(d.last));
      r += buf;
    }
    return r;
  };
  while (i < pat.size()) {
    char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      char e = pat[i + 1];
      if (e == 'p' && i + 2 < pat.size()) {
        size_t end;
        std::string cat;
        if (pat[i + 2] == '{') {
          end = pat.find('}', i + 3);
          if (end == std::string::npos) break;
          cat = pat.substr(i + 3, end - i - 3);
          ++end;
        } else {
          cat = pat.substr(i + 2, 1);
          end = i + 3;
        }
        bool general = (cat.size() == 1 || cat.size() == 2) && std::string_view("LMNPSZC").find(cat[0]) != std::string_view::npos;
        std::string extra = general ? ranges_for(cat) : std::string();
        std::string orig = pat.substr(i, end - i);
        if (extra.empty()) out += orig;
        else if (in_class) out += orig + extra;
        else out += "[" + orig + extra + "]";
        i = end;
        continue;
      }
      out += pat.substr(i, 2);
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < pat.size() && pat[i] == '^') out += pat[i++];
      if (i < pat.size() && pat[i] == ']') out += pat[i++];  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < pat.size() && pat[i + 1] == ':') {
      size_t end = pat.find(":]", i + 2);  // POSIX class such as [:alpha:]
      if (end != std::string::npos) {
        out += pat.substr(i, end + 2 - i);
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  if (i < pat.size()) out += pat.substr(i);
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<char*>(buf);
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_context* mctx = nullptr;
  bool jit = false;
  ~Impl() {
    pcre2_match_context_free(mctx);
    pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern, bool literal) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  std::string compiled = pattern;
  if (literal)
    opts |= PCRE2_LITERAL;
  else
    compiled = widen_unicode_classes(pattern);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), opts,
                              &err, &err_off, nullptr);
  if (!impl_->code)
    fail("tokenizer.json: regex '", pattern, "' does not compile at offset ", err_off, ": ",
         pcre2_message(err));
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
  impl_->mctx = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(impl_->mctx, kMatchLimit);
  pcre2_set_depth_limit(impl_->mctx, kMatchLimit);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

namespace {

// Match data for one pair of offsets is not tied to a pattern; one per thread saves an
// allocation per pre-tokenized piece.
struct ThreadMatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(md); }
};

}  // namespace

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  thread_local ThreadMatchData scratch;
  pcre2_match_data* md = scratch.md;
  if (!md) fail("out of memory for regex match data");
  // The default JIT stack (32 KiB) is enough for pre-tokenizer patterns; a larger one is
  // made only when a match needs it.
  // The shared match context is never modified, so matching stays thread-safe.
  pcre2_jit_stack* big_stack = nullptr;
  pcre2_match_context* mctx = impl_->mctx;
  auto cleanup = [&] {
    if (big_stack) {
      pcre2_match_context_free(mctx);
      pcre2_jit_stack_free(big_stack);
    }
  };
  auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos <= subject.size()) {
    // Input is validated UTF-8 before it gets here, so PCRE2 need not re-check it.
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx)
                        : pcre2_match(impl_->code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !big_stack) {
      big_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      if (!big_stack) {
        fail("out of memory for the pre-tokenizer regex stack");
      }
      mctx = pcre2_match_context_copy(impl_->mctx);
      pcre2_jit_stack_assign(mctx, nullptr, big_stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      cleanup();
      fail("pre-tokenizer regex failed on the input (", pcre2_message(rc), ")");
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      pos = e;
    } else {
      // Empty match: step over one whole character.
      if (e >= subject.size()) break;
      pos = e + 1;
      while (pos < subject.size() && (static_cast<uint8_t>(subject[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  cleanup();
}

}  // namespace tetra::tok
