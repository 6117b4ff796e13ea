// Fuzz target: the chat output parsers (reasoning, then tool calls) on any generated text. The
// first byte picks the formats; the text is parsed whole and in pieces cut where the input's
// hash says, and the two must agree exactly (content, reasoning, every call), never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/chat_output.h"

namespace {

using namespace tetra::server;

struct Parsed {
  std::string reasoning, content, calls;
};

void add(Parsed& p, const ChatDelta& d) {
  p.reasoning += d.reasoning;
  p.content += d.content;
  for (const IndexedToolCall& c : d.calls)
    p.calls += std::to_string(c.index) + ":" + c.call.id + ":" + c.call.name + ":" + c.call.arguments + ";";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  static const ToolFormat kTools[] = {ToolFormat::Hermes, ToolFormat::Glm45, ToolFormat::DeepSeekV3, ToolFormat::KimiK2};
  static const ReasoningFormat kReasoning[] = {ReasoningFormat::Qwen3, ReasoningFormat::Glm45, ReasoningFormat::DeepSeekR1};
  ChatOutputOptions o;
  o.tool_format = kTools[mode & 3];
  if (((mode >> 2) & 3) != 3) o.reasoning = kReasoning[(mode >> 2) & 3];
  o.prompt_in_thinking = (mode >> 4) & 1;
  o.parallel_tool_calls = !((mode >> 5) & 1);

  Parsed whole, pieces;
  ChatOutput a(o);
  add(whole, a.push(text));
  add(whole, a.finish());
  ChatOutput b(o);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  for (size_t at = 0; at < text.size();) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    const size_t n = std::min<size_t>(1 + (h >> 59), text.size() - at);
    add(pieces, b.push(std::string_view(text).substr(at, n)));
    at += n;
  }
  add(pieces, b.finish());
  if (whole.reasoning != pieces.reasoning || whole.content != pieces.content || whole.calls != pieces.calls) std::abort();
  return 0;
}

std::vector<std::string> tetra_fuzz_seeds() {
  return {std::string(1, '\0') + "<think>\nhm\n</think>\n\nOk.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
          std::string("\x0d", 1) + "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
          std::string("\x0a", 1) + "x</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
                                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
          std::string("\x2b", 1) + "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}"
                                   "<|tool_call_end|><|tool_calls_section_end|>"};
}
