#include "server/tool_parser.h"

#include <algorithm>

#include "server/json_depth.h"
#include "server/reasoning_parser.h"

namespace tetra::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Hermes and GLM write bare calls one after another; DeepSeek-V3 and Kimi K2 wrap them in a
// section. The marker strings are the models' own (special tokens of DeepSeek-V3 and Kimi K2).
struct Markers {
  std::string_view section_begin, section_end;  // empty: calls are not wrapped
  std::string_view call_begin, call_end;
};

Markers markers_of(ToolFormat f) {
  switch (f) {
    case ToolFormat::Hermes:
    case ToolFormat::Glm45: return {"", "", "<tool_call>", "</tool_call>"};
    case ToolFormat::DeepSeekV3:
      return {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"};
    case ToolFormat::KimiK2:
      return {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>"};
  }
  return {};
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool blank(std::string_view s) { return trim(s).empty(); }

std::string dump_text(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

// A JSON object's text, or nullopt. Key order is kept (ordered_json), as the model wrote it.
std::optional<std::string> object_text(std::string_view s) {
  ordered_json j = ordered_json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || json_nested_deeper_than(j)) return std::nullopt;
  return dump_text(j);
}

std::optional<ParsedToolCall> parse_hermes(std::string_view body) {
  ordered_json j = ordered_json::parse(trim(body), nullptr, false);
  if (j.is_discarded() || !j.is_object() || json_nested_deeper_than(j)) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ParsedToolCall call{.name = name->get<std::string>(), .arguments = "{}"};
  if (args != j.end() && !args->is_null()) {
    // Some models write the arguments as a JSON string holding the object.
    std::optional<std::string> text = args->is_string() ? object_text(args->get_ref<const std::string&>())
                                      : args->is_object() ? std::optional(dump_text(*args))
                                                          : std::nullopt;
    if (!text) return std::nullopt;
    call.arguments = std::move(*text);
  }
  return call;
}

// The JSON-schema type of a tool's parameter, or "" when the tools do not say.
std::string parameter_type(const json& tools, const std::string& function, const std::string& param) {
  if (!tools.is_array()) return "";
  for (const json& t : tools) {
    const json* f = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
    if (!f || !f->is_object() || f->value("name", json()) != function) continue;
    const json* props = f->contains("parameters") && (*f)["parameters"].is_object() &&
                                (*f)["parameters"].contains("properties")
                            ? &(*f)["parameters"]["properties"]
                            : nullptr;
    if (!props || !props->is_object() || !props->contains(param) || !(*props)[param].is_object()) return "";
    const json& type = (*props)[param].value("type", json());
    return type.is_string() ? type.get<std::string>() : "";
  }
  return "";
}

std::optional<ParsedToolCall> parse_glm(std::string_view body, const json& tools) {
  constexpr std::string_view kKey = "<arg_key>", kKeyEnd = "</arg_key>", kValue = "<arg_value>",
                             kValueEnd = "</arg_value>";
  const size_t first = body.find(kKey);
  const std::string name(trim(body.substr(0, first)));
  if (name.empty() || name.find_first_of(" \n\t<>") != std::string::npos) return std::nullopt;
  ordered_json args = ordered_json::object();
  std::string_view rest = first == std::string_view::npos ? std::string_view() : body.substr(first);
  while (!blank(rest)) {
    rest = trim(rest);
    if (rest.substr(0, kKey.size()) != kKey) return std::nullopt;
    const size_t key_end = rest.find(kKeyEnd);
    if (key_end == std::string_view::npos) return std::nullopt;
    const std::string key(trim(rest.substr(kKey.size(), key_end - kKey.size())));
    rest = trim(rest.substr(key_end + kKeyEnd.size()));
    if (key.empty() || rest.substr(0, kValue.size()) != kValue) return std::nullopt;
    const size_t value_end = rest.find(kValueEnd);
    if (value_end == std::string_view::npos) return std::nullopt;
    const std::string_view value = rest.substr(kValue.size(), value_end - kValue.size());
    rest = rest.substr(value_end + kValueEnd.size());
    // The template writes strings bare and everything else as JSON: read it back the same way.
    ordered_json v = parameter_type(tools, name, key) == "string"
                         ? ordered_json(ordered_json::value_t::discarded)
                         : ordered_json::parse(value, nullptr, false);
    if (json_nested_deeper_than(v)) return std::nullopt;
    args[key] = v.is_discarded() ? ordered_json(std::string(value)) : std::move(v);
  }
  return ParsedToolCall{.name = name, .arguments = dump_text(args)};
}

std::optional<ParsedToolCall> parse_deepseek(std::string_view body) {
  constexpr std::string_view kSep = "<｜tool▁sep｜>";
  const size_t sep = body.find(kSep);
  if (sep == std::string_view::npos) return std::nullopt;
  std::string_view rest = body.substr(sep + kSep.size());
  if (trim(body.substr(0, sep)) != "function") {
    // DeepSeek-V3.1 and later drop the type and the fence: NAME<｜tool▁sep｜>{...}.
    const std::string name(trim(body.substr(0, sep)));
    auto text = object_text(trim(rest));
    if (name.empty() || !text) return std::nullopt;
    return ParsedToolCall{.name = name, .arguments = std::move(*text)};
  }
  const size_t newline = rest.find('\n');
  if (newline == std::string_view::npos) return std::nullopt;
  const std::string name(trim(rest.substr(0, newline)));
  std::string_view args = trim(rest.substr(newline + 1));
  if (args.substr(0, 7) == "```json") args.remove_prefix(7);
  else if (args.substr(0, 3) == "```") args.remove_prefix(3);
  else return std::nullopt;
  if (args.size() < 3 || args.substr(args.size() - 3) != "```") return std::nullopt;
  args.remove_suffix(3);
  auto text = object_text(args);
  if (name.empty() || !text) return std::nullopt;
  return ParsedToolCall{.name = name, .arguments = std::move(*text)};
}

std::optional<ParsedToolCall> parse_kimi(std::string_view body) {
  constexpr std::string_view kArgs = "<|tool_call_argument_begin|>";
  const size_t at = body.find(kArgs);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string id(trim(body.substr(0, at)));
  // functions.NAME:IDX: the name sits between the last '.' before the ':' and the ':'.
  const std::string head = id.substr(0, id.find(':'));
  const std::string name = head.substr(head.rfind('.') == std::string::npos ? 0 : head.rfind('.') + 1);
  auto text = object_text(trim(body.substr(at + kArgs.size())));
  if (name.empty() || !text) return std::nullopt;
  return ParsedToolCall{.id = id, .name = name, .arguments = std::move(*text)};
}

}  // namespace

std::optional<ToolFormat> tool_format_named(std::string_view name) {
  if (name == "hermes") return ToolFormat::Hermes;
  if (name == "glm45" || name == "glm47") return ToolFormat::Glm45;
  if (name == "deepseek_v3") return ToolFormat::DeepSeekV3;
  if (name == "kimi_k2") return ToolFormat::KimiK2;
  return std::nullopt;
}

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::Hermes: return "hermes";
    case ToolFormat::Glm45: return "glm45";
    case ToolFormat::DeepSeekV3: return "deepseek_v3";
    case ToolFormat::KimiK2: return "kimi_k2";
  }
  return "?";
}

std::optional<ToolFormat> tool_format_for_family(std::string_view t, bool kimi_markers) {
  if (t == "qwen3_moe") return ToolFormat::Hermes;
  if (t == "glm4_moe" || t == "glm4_moe_lite" || t == "glm_moe_dsa") return ToolFormat::Glm45;
  if (t == "deepseek_v3") return kimi_markers ? ToolFormat::KimiK2 : ToolFormat::DeepSeekV3;
  return std::nullopt;  // mixtral: no tool-call format of its own
}

std::optional<ParsedToolCall> parse_tool_call_body(ToolFormat format, std::string_view body, const json& tools) {
  switch (format) {
    case ToolFormat::Hermes: return parse_hermes(body);
    case ToolFormat::Glm45: return parse_glm(body, tools);
    case ToolFormat::DeepSeekV3: return parse_deepseek(body);
    case ToolFormat::KimiK2: return parse_kimi(body);
  }
  return std::nullopt;
}

ToolParser::ToolParser(ToolFormat format, json tools) : format_(format), tools_(std::move(tools)) {}

ToolDelta ToolParser::push(std::string_view text) {
  held_ += text;
  ToolDelta out;
  step(out);
  return out;
}

void ToolParser::end_call(std::string_view body, bool terminated, ToolDelta& out) {
  const Markers m = markers_of(format_);
  last_call_ok_ = false;
  if (auto call = parse_tool_call_body(format_, body, tools_)) {
    out.calls.push_back(std::move(*call));
    section_has_call_ = last_call_ok_ = true;
    owed_.clear();
    return;
  }
  out.content += owed_ + std::string(m.call_begin) + std::string(body) + (terminated ? std::string(m.call_end) : "");
  owed_.clear();
}

void ToolParser::step(ToolDelta& out) {
  const Markers m = markers_of(format_);
  const bool wrapped = !m.section_begin.empty();
  for (;;) {
    if (state_ == State::Text) {
      const std::string_view opener = wrapped ? m.section_begin : m.call_begin;
      const size_t at = held_.find(opener);
      // Whitespace right before the calls separates them from the content (templates write
      // "content\n<tool_call>"): it is not content, so it is held until text follows it.
      if (at == std::string::npos) {
        size_t end = held_.size() - partial_marker_length(held_, opener);
        while (end > 0 && is_space(held_[end - 1])) --end;
        out.content += held_.substr(0, end);
        held_.erase(0, end);
        return;
      }
      size_t end = at;
      while (end > 0 && is_space(held_[end - 1])) --end;
      out.content += held_.substr(0, end);
      owed_ = held_.substr(end, at - end) + (wrapped ? std::string(opener) : std::string());
      section_has_call_ = false;
      held_.erase(0, at + opener.size());
      state_ = wrapped ? State::Section : State::Call;
    } else if (state_ == State::Call) {
      const size_t at = held_.find(m.call_end);
      if (at == std::string::npos) return;  // the whole call is needed to parse it
      end_call(std::string_view(held_).substr(0, at), true, out);
      held_.erase(0, at + m.call_end.size());
      state_ = State::Section;
    } else if (wrapped) {
      // Between calls of a section: whitespace is dropped, other text is content.
      const size_t call = held_.find(m.call_begin), end = held_.find(m.section_end);
      if (call == std::string::npos && end == std::string::npos) return;
      const size_t at = std::min(call, end);
      const std::string between = held_.substr(0, at);
      if (!blank(between)) {
        out.content += owed_ + between;
        owed_.clear();
      } else if (!section_has_call_) {
        owed_ += between;  // text again if no call of the section parses
      }
      // A section none of whose calls parsed is all text, its markers included.
      if (at == end && !section_has_call_) {
        out.content += owed_ + std::string(m.section_end);
        owed_.clear();
      }
      held_.erase(0, at + (at == call ? m.call_begin.size() : m.section_end.size()));
      state_ = at == call ? State::Call : State::Text;
    } else {
      // After a bare call: another call may follow after whitespace; anything else is text.
      size_t lead = 0;
      while (lead < held_.size() && is_space(held_[lead])) ++lead;
      const std::string_view rest = std::string_view(held_).substr(lead);
      if (rest.size() < m.call_begin.size() && m.call_begin.substr(0, rest.size()) == rest) return;
      if (rest.substr(0, m.call_begin.size()) == m.call_begin) {
        owed_ = held_.substr(0, lead);
        held_.erase(0, lead + m.call_begin.size());
        state_ = State::Call;
      } else {
        state_ = State::Text;
      }
    }
  }
}

ToolDelta ToolParser::finish() {
  ToolDelta out;
  switch (state_) {
    case State::Text: out.content += held_; break;
    // A call cut short (the model stopped before its end marker) is kept if its body parses.
    case State::Call: end_call(held_, false, out); break;
    case State::Section:
      if (!markers_of(format_).section_begin.empty() && !section_has_call_) out.content += owed_ + held_;
      else if (!blank(held_) || !last_call_ok_) out.content += held_;
      break;
  }
  held_.clear();
  owed_.clear();
  state_ = State::Text;
  return out;
}

}  // namespace tetra::server
