// Tool calls in generated text: each model family writes its calls in its own format, and the
// parser turns them back into OpenAI tool calls as the text streams (vLLM's --tool-call-parser
// names). Text outside the calls is content; a call that does not parse (bad JSON, no name)
// stays content, as its raw text. Text that could be the start of a marker is held back until
// the next piece settles it, so streamed and whole-text parses give the same result.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra::server {

enum class ToolFormat {
  // hermes (Qwen3): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
  Hermes,
  // glm45 (GLM-4.5+, GLM-5): <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
  Glm45,
  // deepseek_v3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
  //              <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
  DeepSeekV3,
  // kimi_k2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
  //          {...}<|tool_call_end|>...<|tool_calls_section_end|>
  KimiK2,
};

std::optional<ToolFormat> tool_format_named(std::string_view name);
const char* tool_format_name(ToolFormat f);
// The format a family's chat template teaches its model (model_type from config.json). Kimi K2
// shares DeepSeek-V3's model_type but not its markers: `kimi_markers` says the tokenizer has
// Kimi's <|tool_call_begin|>.
std::optional<ToolFormat> tool_format_for_family(std::string_view model_type, bool kimi_markers);

struct ParsedToolCall {
  std::string id;         // the model's own id (Kimi K2's functions.NAME:IDX), else empty
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ToolDelta {
  std::string content;
  std::vector<ParsedToolCall> calls;
};

class ToolParser {
 public:
  // `tools`: the request's tool list (null or an array); GLM's untyped argument values are
  // read as JSON unless the tool's schema says the parameter is a string.
  ToolParser(ToolFormat format, nlohmann::json tools);
  ToolDelta push(std::string_view text);
  ToolDelta finish();

 private:
  enum class State { Text, Section, Call };
  void step(ToolDelta& out);
  void end_call(std::string_view body, bool terminated, ToolDelta& out);

  ToolFormat format_;
  nlohmann::json tools_;
  State state_ = State::Text;
  std::string held_;
  // Text consumed on the way into a call (the whitespace before it, a section's opening
  // marker) that becomes content again should the call not parse.
  std::string owed_;
  bool section_has_call_ = false;  // a call of the current section (or run of bare calls) parsed
  bool last_call_ok_ = false;
};

// Parses one call's body (the text between its markers); nullopt when it is malformed.
std::optional<ParsedToolCall> parse_tool_call_body(ToolFormat format, std::string_view body,
                                                   const nlohmann::json& tools);

}  // namespace tetra::server
