// A compiled PCRE2 pattern (UTF + UCP, JIT when available) with a match limit, so that a
// hostile tokenizer.json regex such as (a+)+ fails with an error instead of hanging.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tetra::tok {

class Regex {
 public:
  // `literal`: the pattern is a plain string to find, not a regex.
  Regex(const std::string& pattern, bool literal);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // All non-overlapping matches in `subject`, left to right, as [begin, end) byte offsets.
  // After an empty match the search resumes one character later (as Oniguruma's find_iter).
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace tetra::tok
