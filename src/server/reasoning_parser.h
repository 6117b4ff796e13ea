// Reasoning output: a thinking model writes <think>...</think> before its answer. The parser
// splits the generated text into reasoning (message.reasoning_content) and content as it
// streams, with vLLM's --reasoning-parser names and rules. Text that could be the start of a
// tag is held back until the next piece settles it, so what is emitted never changes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tetra::server {

enum class ReasoningFormat {
  Qwen3,       // qwen3: reasoning only inside <think>...</think> (opened by the output or the prompt)
  Glm45,       // glm45: the same tags and rule (GLM-4.5/4.6/4.7, GLM-5)
  DeepSeekR1,  // deepseek_r1: everything before </think> is reasoning, even without <think>
};

std::optional<ReasoningFormat> reasoning_format_named(std::string_view name);
const char* reasoning_format_name(ReasoningFormat f);

// True when the rendered prompt ends inside an open <think> block (templates that start the
// thinking for the model), so the output begins as reasoning and only </think> appears.
bool prompt_opens_thinking(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  ReasoningParser(ReasoningFormat format, bool prompt_in_thinking);
  // Adds generated text; returns what is now settled.
  ReasoningDelta push(std::string_view text);
  // The end of generation: releases what was held back.
  ReasoningDelta finish();

 private:
  enum class State { Start, Reasoning, Content };
  void step(ReasoningDelta& out);

  bool assume_thinking_;  // text before any tag is reasoning
  State state_ = State::Start;
  std::string held_;
};

// The longest suffix of `text` that is a proper prefix of `marker` (its length).
size_t partial_marker_length(std::string_view text, std::string_view marker);

}  // namespace tetra::server
