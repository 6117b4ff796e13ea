// One chat choice's generated text split into what the response carries: reasoning
// (message.reasoning_content), content, and tool calls with their stream index. Reasoning is
// split off first and tool calls are looked for in what follows it, as vLLM does.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/reasoning_parser.h"
#include "server/tool_parser.h"

namespace tetra::server {

struct ChatOutputOptions {
  std::optional<ReasoningFormat> reasoning;  // --reasoning-parser
  bool prompt_in_thinking = false;           // the rendered prompt left a <think> open
  std::optional<ToolFormat> tool_format;     // null: tool calls are not looked for
  nlohmann::json tools;                      // the request's, for typed argument values
  bool parallel_tool_calls = true;           // false: calls after the first are dropped
};

struct IndexedToolCall {
  int index = 0;
  ParsedToolCall call;
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<IndexedToolCall> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class ChatOutput {
 public:
  explicit ChatOutput(const ChatOutputOptions& options);
  ChatDelta push(std::string_view text);
  ChatDelta finish();
  int n_calls() const { return n_calls_; }
  bool reasoning_enabled() const { return reasoning_ != nullptr; }

 private:
  void take_content(std::string_view text, bool last, ChatDelta& out);

  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolParser> tools_;
  bool parallel_ = true;
  int n_calls_ = 0;
};

}  // namespace tetra::server
