// Tool-call and reasoning parsers on each family's own output format: whole texts, then the
// same texts fed in random pieces (markers and UTF-8 characters cut anywhere), which must give
// exactly the same content, reasoning and calls.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/chat_output.h"
#include "server/reasoning_parser.h"
#include "server/tool_parser.h"
#include "tests/tokenizer/test_data.h"
#include "tokenizer/chat_template.h"

namespace tetra::server {
namespace {

using nlohmann::json;

struct ToolResult {
  std::string content;
  std::vector<ParsedToolCall> calls;
};

ToolResult parse_whole(ToolFormat f, const std::string& text, const json& tools = nullptr) {
  ToolParser p(f, tools);
  ToolDelta a = p.push(text), b = p.finish();
  ToolResult r{a.content + b.content, a.calls};
  r.calls.insert(r.calls.end(), b.calls.begin(), b.calls.end());
  return r;
}

// Feeds `text` in pieces of 1..max_piece bytes; every emitted piece must be final (the
// concatenation is compared with the whole-text parse).
ToolResult parse_pieces(ToolFormat f, const std::string& text, std::mt19937& rng, size_t max_piece,
                        const json& tools = nullptr) {
  ToolParser p(f, tools);
  ToolResult r;
  std::uniform_int_distribution<size_t> len(1, max_piece);
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(len(rng), text.size() - at);
    ToolDelta d = p.push(std::string_view(text).substr(at, n));
    r.content += d.content;
    r.calls.insert(r.calls.end(), d.calls.begin(), d.calls.end());
    at += n;
  }
  ToolDelta d = p.finish();
  r.content += d.content;
  r.calls.insert(r.calls.end(), d.calls.begin(), d.calls.end());
  return r;
}

void expect_same(const ToolResult& a, const ToolResult& b, const std::string& label) {
  EXPECT_EQ(a.content, b.content) << label;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << label;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << label;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << label;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << label;
  }
}

// Whole-text parse, then 200 random splittings (byte by byte among them) must agree with it.
ToolResult check_streaming(ToolFormat f, const std::string& text, const json& tools = nullptr) {
  ToolResult whole = parse_whole(f, text, tools);
  std::mt19937 rng(1234);
  expect_same(parse_pieces(f, text, rng, 1, tools), whole, "byte by byte: " + text);
  for (int i = 0; i < 200; ++i) expect_same(parse_pieces(f, text, rng, 1 + i % 12, tools), whole, "pieces: " + text);
  return whole;
}

json args(const ParsedToolCall& c) { return json::parse(c.arguments); }

TEST(ToolParser, Names) {
  EXPECT_EQ(tool_format_named("hermes"), ToolFormat::Hermes);
  EXPECT_EQ(tool_format_named("glm45"), ToolFormat::Glm45);
  EXPECT_EQ(tool_format_named("deepseek_v3"), ToolFormat::DeepSeekV3);
  EXPECT_EQ(tool_format_named("kimi_k2"), ToolFormat::KimiK2);
  EXPECT_EQ(tool_format_named("mistral"), std::nullopt);
  EXPECT_EQ(tool_format_for_family("qwen3_moe", false), ToolFormat::Hermes);
  for (const char* glm : {"glm4_moe", "glm4_moe_lite", "glm_moe_dsa"})
    EXPECT_EQ(tool_format_for_family(glm, false), ToolFormat::Glm45) << glm;
  EXPECT_EQ(tool_format_for_family("deepseek_v3", false), ToolFormat::DeepSeekV3);
  EXPECT_EQ(tool_format_for_family("deepseek_v3", true), ToolFormat::KimiK2);
  EXPECT_EQ(tool_format_for_family("mixtral", false), std::nullopt);
}

TEST(ToolParser, HermesQwen3) {
  const std::string text =
      "I'll check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>";
  ToolResult r = check_streaming(ToolFormat::Hermes, text);
  EXPECT_EQ(r.content, "I'll check both.");  // the newline before the calls is not content
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), json({{"city", "Paris"}, {"unit", "c"}}));
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","unit":"c"})");  // the model's key order
  EXPECT_EQ(r.calls[1].name, "add");
  EXPECT_EQ(args(r.calls[1]), json({{"a", 2}, {"b", 3}}));
  EXPECT_TRUE(r.calls[0].id.empty());  // the server assigns ids

  // No call: all content, "<" and "<tool" prefixes released at the end.
  EXPECT_EQ(check_streaming(ToolFormat::Hermes, "a < b and <tool").content, "a < b and <tool");
  // Text after the calls is content, not lost.
  ToolResult after = check_streaming(ToolFormat::Hermes,
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nDone.");
  ASSERT_EQ(after.calls.size(), 1u);
  EXPECT_EQ(after.content, "\nDone.");
  // A call the model did not close (it stopped at its end-of-turn token) still counts.
  ToolResult open = check_streaming(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n");
  ASSERT_EQ(open.calls.size(), 1u);
  EXPECT_EQ(args(open.calls[0]), json({{"x", 1}}));
}

TEST(ToolParser, HermesMalformedFallsBackToContent) {
  for (const std::string& text : {
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>"),
           std::string("<tool_call>\n{\"arguments\": {}}\n</tool_call>"),               // no name
           std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>"),  // not an object
           std::string("<tool_call>\n{\"name\": \"f\", \"argu"),                           // cut off
       }) {
    ToolResult r = check_streaming(ToolFormat::Hermes, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  // Arguments nested 100,000 deep (a model can write that): refused before anything recurses.
  std::string nest;
  for (int i = 0; i < 100000; ++i) nest += "{\"a\":";
  nest += "1" + std::string(100000, '}');
  const std::string deep = "<tool_call>\n{\"name\": \"f\", \"arguments\": " + nest + "}\n</tool_call>";
  ToolResult nested = parse_whole(ToolFormat::Hermes, deep);
  EXPECT_TRUE(nested.calls.empty());
  EXPECT_EQ(nested.content, deep);
  // One bad call among good ones: the good ones stay calls.
  ToolResult mixed = check_streaming(ToolFormat::Hermes,
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\nnot json\n</tool_call>");
  ASSERT_EQ(mixed.calls.size(), 1u);
  EXPECT_EQ(mixed.content, "\n<tool_call>\nnot json\n</tool_call>");
  // The whitespace before a call that does not parse is the text's again.
  const std::string after_text = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>";
  EXPECT_EQ(check_streaming(ToolFormat::Hermes, after_text).content, after_text);
}

TEST(ToolParser, Glm45) {
  const std::string text =
      "Looking it up.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"metric\": true}</arg_value>\n"
      "</tool_call>\n<tool_call>now\n</tool_call>";
  ToolResult r = check_streaming(ToolFormat::Glm45, text);
  EXPECT_EQ(r.content, "Looking it up.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), json({{"city", "Paris"}, {"days", 3}, {"opts", {{"metric", true}}}}));
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(args(r.calls[1]), json::object());

  // GLM-4.7 and GLM-5 write no newlines inside the call.
  ToolResult compact = check_streaming(ToolFormat::Glm45,
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
      "<arg_value>3</arg_value></tool_call>");
  ASSERT_EQ(compact.calls.size(), 1u);
  EXPECT_EQ(compact.calls[0].name, "get_weather");
  EXPECT_EQ(args(compact.calls[0]), json({{"city", "Paris"}, {"days", 3}}));

  // The schema says `days` is a string: the value stays text.
  json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"days": {"type": "string"}}}}}])");
  ToolResult typed = check_streaming(ToolFormat::Glm45, text, tools);
  EXPECT_EQ(args(typed.calls[0])["days"], "3");

  for (const std::string& bad : {std::string("<tool_call>\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"),
                                std::string("<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>"),
                                std::string("<tool_call>f\n<arg_value>1</arg_value>\n</tool_call>")}) {
    ToolResult m = check_streaming(ToolFormat::Glm45, bad);
    EXPECT_TRUE(m.calls.empty()) << bad;
    EXPECT_EQ(m.content, bad);
  }
}

TEST(ToolParser, DeepSeekV3) {
  const std::string text =
      "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
      "{\"a\": 2, \"b\": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ToolResult r = check_streaming(ToolFormat::DeepSeekV3, text);
  EXPECT_EQ(r.content, "Let me look.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), json({{"city", "Paris"}}));
  EXPECT_EQ(r.calls[1].name, "add");
  EXPECT_EQ(args(r.calls[1]), json({{"a", 2}, {"b", 3}}));

  // DeepSeek-V3.1's shorter form: NAME<｜tool▁sep｜>{...}.
  ToolResult v31 = check_streaming(ToolFormat::DeepSeekV3,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  ASSERT_EQ(v31.calls.size(), 1u);
  EXPECT_EQ(v31.calls[0].name, "get_weather");
  EXPECT_EQ(args(v31.calls[0]), json({{"city", "Oslo"}}));

  const std::string bad_call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{oops}\n```<｜tool▁call▁end｜>";
  const std::string bad_section = "Hm. <｜tool▁calls▁begin｜>" + bad_call + "<｜tool▁calls▁end｜>";
  ToolResult m = check_streaming(ToolFormat::DeepSeekV3, bad_section);
  EXPECT_TRUE(m.calls.empty());
  EXPECT_EQ(m.content, bad_section);  // a section of calls that do not parse is all text
  // "｜" cut inside its UTF-8 bytes or a lookalike prefix: released as text.
  EXPECT_EQ(check_streaming(ToolFormat::DeepSeekV3, "x <｜tool▁c").content, "x <｜tool▁c");
}

TEST(ToolParser, KimiK2) {
  const std::string text =
      "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
      "{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>"
      "{\"a\": 2, \"b\": 3}<|tool_call_end|><|tool_calls_section_end|>";
  ToolResult r = check_streaming(ToolFormat::KimiK2, text);
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), json({{"city", "Paris"}}));
  EXPECT_EQ(r.calls[1].id, "functions.add:1");
  EXPECT_EQ(r.calls[1].name, "add");

  const std::string bad = "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": <|tool_call_end|>";
  const std::string bad_section = "<|tool_calls_section_begin|>" + bad + "<|tool_calls_section_end|>";
  ToolResult m = check_streaming(ToolFormat::KimiK2, bad_section);
  EXPECT_TRUE(m.calls.empty());
  EXPECT_EQ(m.content, bad_section);
}

// Random texts built from pieces of every format's markers, JSON and plain text: for every
// format, any splitting gives what the whole text gives, and a text in which no call parses
// comes back unchanged as content (nothing lost, nothing doubled).
TEST(ToolParser, RandomTextsParseTheSameInAnyPieces) {
  const std::vector<std::string> pieces = {
      "<tool_call>", "</tool_call>", "<tool_", "call>", "\n", " ", "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
      "{", "}", "\"", "f", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "x",
      "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function<｜tool▁sep｜>f\n```json\n{}\n```", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>", "<｜tool", "<|tool_calls_section_begin|>", "<|tool_call_begin|>",
      "functions.f:0<|tool_call_argument_begin|>{}", "<|tool_call_end|>", "<|tool_calls_section_end|>", "<|tool",
      "é", "日本", "<", "|"};
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> pick(0, pieces.size() - 1), count(0, 24);
  for (int round = 0; round < 1000; ++round) {
    std::string text;
    for (size_t n = count(rng); n > 0; --n) text += pieces[pick(rng)];
    for (ToolFormat f : {ToolFormat::Hermes, ToolFormat::Glm45, ToolFormat::DeepSeekV3, ToolFormat::KimiK2}) {
      ToolResult whole = parse_whole(f, text);
      for (int k = 0; k < 5; ++k) expect_same(parse_pieces(f, text, rng, 1 + size_t(k) * 3), whole, text);
      if (whole.calls.empty()) {
        EXPECT_EQ(whole.content, text) << tool_format_name(f);
      }
    }
  }
}

struct ReasoningResult {
  std::string reasoning, content;
};

ReasoningResult reason_pieces(ReasoningFormat f, bool in_thinking, const std::string& text, std::mt19937* rng,
                              size_t max_piece) {
  ReasoningParser p(f, in_thinking);
  ReasoningResult r;
  std::uniform_int_distribution<size_t> len(1, max_piece);
  for (size_t at = 0; at < text.size();) {
    const size_t n = rng ? std::min(len(*rng), text.size() - at) : text.size();
    ReasoningDelta d = p.push(std::string_view(text).substr(at, n));
    r.reasoning += d.reasoning;
    r.content += d.content;
    at += n;
  }
  ReasoningDelta d = p.finish();
  r.reasoning += d.reasoning;
  r.content += d.content;
  return r;
}

ReasoningResult check_reasoning(ReasoningFormat f, bool in_thinking, const std::string& text) {
  ReasoningResult whole = reason_pieces(f, in_thinking, text, nullptr, 0);
  std::mt19937 rng(99);
  for (int i = 0; i < 200; ++i) {
    ReasoningResult part = reason_pieces(f, in_thinking, text, &rng, 1 + i % 9);
    EXPECT_EQ(part.reasoning, whole.reasoning) << text;
    EXPECT_EQ(part.content, whole.content) << text;
  }
  return whole;
}

TEST(ReasoningParser, Qwen3AndGlm) {
  for (ReasoningFormat f : {ReasoningFormat::Qwen3, ReasoningFormat::Glm45}) {
    ReasoningResult r = check_reasoning(f, false, "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.");
    EXPECT_EQ(r.reasoning, "\nThe user wants 2+2.\n");
    EXPECT_EQ(r.content, "\n\nIt is 4.");
    // The template opened the thinking (Qwen3 thinking templates, enable_thinking): only </think>.
    r = check_reasoning(f, true, "The user wants 2+2.\n</think>\n\nIt is 4.");
    EXPECT_EQ(r.reasoning, "The user wants 2+2.\n");
    EXPECT_EQ(r.content, "\n\nIt is 4.");
    // No thinking (enable_thinking false puts an empty block in the prompt): all content.
    r = check_reasoning(f, false, "It is 4. <think> is a tag.");
    EXPECT_EQ(r.reasoning, "");
    EXPECT_EQ(r.content, "It is 4. <think> is a tag.");
    // Cut off while thinking: all reasoning.
    r = check_reasoning(f, false, "<think>\nstill going </thi");
    EXPECT_EQ(r.reasoning, "\nstill going </thi");
    EXPECT_EQ(r.content, "");
    r = check_reasoning(f, false, "<thin");
    EXPECT_EQ(r.content, "<thin");
  }
}

TEST(ReasoningParser, DeepSeekR1) {
  ReasoningResult r = check_reasoning(ReasoningFormat::DeepSeekR1, false, "Let me think.\n</think>\n\nFour.");
  EXPECT_EQ(r.reasoning, "Let me think.\n");
  EXPECT_EQ(r.content, "\n\nFour.");
  r = check_reasoning(ReasoningFormat::DeepSeekR1, false, "<think>Hmm.</think>Four.");
  EXPECT_EQ(r.reasoning, "Hmm.");
  EXPECT_EQ(r.content, "Four.");
  r = check_reasoning(ReasoningFormat::DeepSeekR1, false, "no end tag");
  EXPECT_EQ(r.reasoning, "no end tag");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningParser, PromptOpensThinking) {
  EXPECT_TRUE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_thinking("<think>x</think> then <think> mention x"));
}

// Each family's own template writes an assistant turn's tool calls exactly as its model is
// trained to write them: rendering a turn and parsing what the template added must give the
// calls back (the family's parser, after its reasoning parser, as the server runs them).
struct Family {
  const char* name;
  std::string template_source;
  ToolFormat tools;
  std::optional<ReasoningFormat> reasoning;
  const char* end_of_turn;  // the model's stop token(s) the template writes after the turn
  bool string_arguments;    // DeepSeek-V3's template concatenates arguments as text
  bool null_content;        // ... and writes tool calls only for a turn with content None
};

TEST(ToolParser, ParsesWhatEachFamilysTemplateWrites) {
  using tok::testing::read_text;
  using tok::testing::require_data;
  const std::string cases = std::string(TETRA_SOURCE_DIR) + "/tools/tokenizer_ref/chat_cases/";
  auto config_template = [&](const char* model) {
    return json::parse(read_text(require_data(std::string(model) + "/tokenizer_config.json")))["chat_template"]
        .get<std::string>();
  };
  const std::vector<Family> families = {
      {"qwen3", config_template("qwen3"), ToolFormat::Hermes, ReasoningFormat::Qwen3, "<|im_end|>\n", false, false},
      {"glm46", read_text(cases + "glm46.jinja"), ToolFormat::Glm45, ReasoningFormat::Glm45, "", false, false},
      {"deepseek_v3", config_template("deepseek_v3"), ToolFormat::DeepSeekV3, std::nullopt, "<｜end▁of▁sentence｜>",
       true, true},
      // Kimi K2 Thinking writes <think>...</think> first, R1-style.
      {"kimi_k2", read_text(cases + "kimi_k2_thinking.jinja"), ToolFormat::KimiK2, ReasoningFormat::DeepSeekR1,
       "<|im_end|>", false, false},
  };
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
      "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}])");
  const std::vector<std::pair<std::string, json>> calls = {{"get_weather", {{"city", "Paris"}, {"days", 2}}},
                                                           {"add", {{"a", 2}, {"b", 3.5}}}};
  for (const Family& f : families) {
    nlohmann::ordered_json user = {{"role", "user"}, {"content", "Weather in Paris, and 2+3.5?"}};
    nlohmann::ordered_json turn = {{"role", "assistant"}, {"content", f.null_content ? nlohmann::ordered_json() : ""}};
    turn["tool_calls"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      nlohmann::ordered_json args = nlohmann::ordered_json::parse(calls[i].second.dump());
      turn["tool_calls"].push_back(
          {{"id", "functions." + calls[i].first + ":" + std::to_string(i)},
           {"type", "function"},
           {"function", {{"name", calls[i].first}, {"arguments", f.string_arguments ? nlohmann::ordered_json(args.dump()) : args}}}});
    }
    tok::ChatRequest prompt, full;
    prompt.messages = full.messages = nlohmann::ordered_json::array({user});
    full.messages.push_back(turn);
    prompt.tools = full.tools = nlohmann::ordered_json::parse(tools.dump());
    full.add_generation_prompt = false;
    tok::TokenizerConfig config;
    const tok::ChatTemplate t(f.template_source);
    const std::string before = t.render(prompt, config), after = t.render(full, config);
    ASSERT_EQ(after.compare(0, before.size(), before), 0) << f.name << ": the prompt is not a prefix of the turn";
    std::string output = after.substr(before.size());
    ASSERT_GE(output.size(), std::string(f.end_of_turn).size()) << f.name;
    ASSERT_EQ(output.substr(output.size() - std::string(f.end_of_turn).size()), f.end_of_turn) << f.name << output;
    output.resize(output.size() - std::string(f.end_of_turn).size());

    ChatOutputOptions o{.reasoning = f.reasoning, .prompt_in_thinking = prompt_opens_thinking(before),
                        .tool_format = f.tools, .tools = tools};
    ChatOutput whole(o);
    ChatDelta a = whole.push(output), b = whole.finish();
    std::vector<IndexedToolCall> got = a.calls;
    got.insert(got.end(), b.calls.begin(), b.calls.end());
    EXPECT_EQ(a.content + b.content, "") << f.name << ": " << output;
    ASSERT_EQ(got.size(), calls.size()) << f.name << ": " << output;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(got[i].index, int(i));
      EXPECT_EQ(got[i].call.name, calls[i].first) << f.name;
      EXPECT_EQ(json::parse(got[i].call.arguments), calls[i].second) << f.name;
    }
    // Streamed byte by byte: the same calls.
    ChatOutput streamed(o);
    std::vector<IndexedToolCall> pieces;
    std::string content;
    for (char ch : output) {
      ChatDelta d = streamed.push(std::string(1, ch));
      content += d.content;
      pieces.insert(pieces.end(), d.calls.begin(), d.calls.end());
    }
    ChatDelta d = streamed.finish();
    content += d.content;
    pieces.insert(pieces.end(), d.calls.begin(), d.calls.end());
    EXPECT_EQ(content, "") << f.name;
    ASSERT_EQ(pieces.size(), got.size()) << f.name;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(pieces[i].call.arguments, got[i].call.arguments) << f.name;
  }
}

}  // namespace
}  // namespace tetra::server
