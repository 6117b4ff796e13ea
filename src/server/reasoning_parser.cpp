#include "server/reasoning_parser.h"

#include <algorithm>

namespace tetra::server {
namespace {

constexpr std::string_view kThinkBegin = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view lstrip(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

}  // namespace

std::optional<ReasoningFormat> reasoning_format_named(std::string_view name) {
  if (name == "qwen3") return ReasoningFormat::Qwen3;
  if (name == "glm45") return ReasoningFormat::Glm45;
  if (name == "deepseek_r1") return ReasoningFormat::DeepSeekR1;
  return std::nullopt;
}

const char* reasoning_format_name(ReasoningFormat f) {
  switch (f) {
    case ReasoningFormat::Qwen3: return "qwen3";
    case ReasoningFormat::Glm45: return "glm45";
    case ReasoningFormat::DeepSeekR1: return "deepseek_r1";
  }
  return "?";
}

bool prompt_opens_thinking(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkBegin);
  if (open == std::string_view::npos) return false;
  return lstrip(prompt.substr(open + kThinkBegin.size())).empty();
}

size_t partial_marker_length(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(text.size(), marker.size() - 1); len > 0; --len)
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  return 0;
}

ReasoningParser::ReasoningParser(ReasoningFormat format, bool prompt_in_thinking)
    : assume_thinking_(prompt_in_thinking || format == ReasoningFormat::DeepSeekR1) {}

ReasoningDelta ReasoningParser::push(std::string_view text) {
  held_ += text;
  ReasoningDelta out;
  step(out);
  return out;
}

void ReasoningParser::step(ReasoningDelta& out) {
  if (state_ == State::Start) {
    // The output may open the thinking itself (after whitespace); wait until that is decided.
    const std::string_view rest = lstrip(held_);
    if (rest.size() < kThinkBegin.size() && kThinkBegin.substr(0, rest.size()) == rest) return;
    if (rest.substr(0, kThinkBegin.size()) == kThinkBegin) {
      held_ = std::string(rest.substr(kThinkBegin.size()));
      state_ = State::Reasoning;
    } else {
      state_ = assume_thinking_ ? State::Reasoning : State::Content;
    }
  }
  if (state_ == State::Reasoning) {
    const size_t end = held_.find(kThinkEnd);
    if (end == std::string::npos) {
      const size_t keep = partial_marker_length(held_, kThinkEnd);
      out.reasoning += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    out.reasoning += held_.substr(0, end);
    held_.erase(0, end + kThinkEnd.size());
    state_ = State::Content;
  }
  out.content += held_;
  held_.clear();
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  if (state_ == State::Start) state_ = assume_thinking_ ? State::Reasoning : State::Content;
  if (state_ == State::Reasoning) out.reasoning += held_;
  else out.content += held_;
  held_.clear();
  return out;
}

}  // namespace tetra::server
