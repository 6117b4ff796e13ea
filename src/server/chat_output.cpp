#include "server/chat_output.h"

namespace tetra::server {

ChatOutput::ChatOutput(const ChatOutputOptions& o) : parallel_(o.parallel_tool_calls) {
  if (o.reasoning) reasoning_ = std::make_unique<ReasoningParser>(*o.reasoning, o.prompt_in_thinking);
  if (o.tool_format) tools_ = std::make_unique<ToolParser>(*o.tool_format, o.tools);
}

void ChatOutput::take_content(std::string_view text, bool last, ChatDelta& out) {
  if (!tools_) {
    out.content += text;
    return;
  }
  ToolDelta d = tools_->push(text);
  if (last) {
    ToolDelta tail = tools_->finish();
    d.content += tail.content;
    d.calls.insert(d.calls.end(), tail.calls.begin(), tail.calls.end());
  }
  out.content += d.content;
  for (ParsedToolCall& c : d.calls) {
    if (!parallel_ && n_calls_ > 0) continue;
    out.calls.push_back({.index = n_calls_++, .call = std::move(c)});
  }
}

ChatDelta ChatOutput::push(std::string_view text) {
  ChatDelta out;
  if (!reasoning_) {
    take_content(text, false, out);
    return out;
  }
  ReasoningDelta r = reasoning_->push(text);
  out.reasoning = std::move(r.reasoning);
  take_content(r.content, false, out);
  return out;
}

ChatDelta ChatOutput::finish() {
  ChatDelta out;
  std::string content;
  if (reasoning_) {
    ReasoningDelta r = reasoning_->finish();
    out.reasoning = std::move(r.reasoning);
    content = std::move(r.content);
  }
  take_content(content, true, out);
  return out;
}

}  // namespace tetra::server
