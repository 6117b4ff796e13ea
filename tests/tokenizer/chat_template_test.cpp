// Chat templates: byte-for-byte parity with Python jinja2 (configured as transformers does)
// on the DeepSeek-V3, Qwen3, GLM-4.6 and Kimi K2 templates (tool calls and results in the
// history among the cases), a GLM-style template and a feature template, plus
// the sandbox limits and error reporting.
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/tokenizer/test_data.h"
#include "tokenizer/chat_template.h"

namespace tetra::tok {
namespace {

using nlohmann::json;
using testing::read_text;
using testing::require_data;

std::string source_dir() { return std::string(TETRA_SOURCE_DIR) + "/tools/tokenizer_ref/chat_cases/"; }

TEST(ChatTemplate, MatchesJinja2OnAllCases) {
  std::map<std::string, std::pair<std::string, TokenizerConfig>> templates;
  for (const char* model : {"deepseek_v3", "qwen3"}) {
    TokenizerConfig c = parse_tokenizer_config(read_text(require_data(std::string(model) + "/tokenizer_config.json")), model);
    templates[model] = {c.chat_template, c};
  }
  TokenizerConfig glm_config;
  glm_config.bos_token = "<s>";
  glm_config.eos_token = "</s>";
  for (const char* name : {"glm_style", "features"})
    templates[name] = {read_text(source_dir() + name + ".jinja"), glm_config};
  for (const char* name : {"glm46", "kimi_k2_thinking"})  // published templates, no bos/eos
    templates[name] = {read_text(source_dir() + name + ".jinja"), TokenizerConfig{}};
  nlohmann::ordered_json cases = nlohmann::ordered_json::parse(read_text(source_dir() + "cases.json"));
  std::map<std::string, nlohmann::ordered_json> by_name;
  for (const auto& c : cases) by_name[c["name"].get<std::string>()] = c;

  std::ifstream ref(require_data("chat_ref.jsonl"));
  std::string line;
  size_t compared = 0, mismatches = 0;
  while (std::getline(ref, line)) {
    json row = json::parse(line);
    const auto& [source, config] = templates.at(row["template"]);
    const nlohmann::ordered_json& c = by_name.at(row["case"].get<std::string>());
    ChatRequest req;
    req.messages = c["messages"];
    if (c.contains("tools")) req.tools = c["tools"];
    req.add_generation_prompt = c.value("add_generation_prompt", true);
    if (c.contains("enable_thinking")) req.enable_thinking = c["enable_thinking"].get<bool>();
    if (c.contains("extra")) req.extra = c["extra"];
    std::string label = row["template"].get<std::string>() + "/" + row["case"].get<std::string>();
    ++compared;
    if (row.contains("error")) {
      EXPECT_THROW(ChatTemplate(source).render(req, config), Error) << label;
      continue;
    }
    std::string got;
    try {
      got = ChatTemplate(source).render(req, config);
    } catch (const Error& e) {
      ADD_FAILURE() << label << ": " << e.what();
      ++mismatches;
      continue;
    }
    if (got != row["text"].get<std::string>()) {
      ++mismatches;
      ADD_FAILURE() << label << " differs\n--- tetra ---\n" << got << "\n--- jinja2 ---\n" << row["text"].get<std::string>();
    }
  }
  std::printf("[ chat ] %zu renders compared, %zu mismatches\n", compared, mismatches);
  EXPECT_GE(compared, 50u);
  EXPECT_EQ(mismatches, 0u);
}

std::string render(const std::string& tmpl, const nlohmann::ordered_json& messages = nlohmann::ordered_json::array(),
                   jinja::Limits limits = {}) {
  ChatRequest req;
  req.messages = messages;
  return ChatTemplate(tmpl, limits).render(req, TokenizerConfig{});
}

std::string error_of(const std::string& tmpl, jinja::Limits limits = {}) {
  try {
    render(tmpl, nlohmann::ordered_json::array(), limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ChatTemplate, ErrorsNameTheLine) {
  EXPECT_NE(error_of("line one\n{% if %}").find("line 2"), std::string::npos) << error_of("line one\n{% if %}");
  EXPECT_NE(error_of("a\nb\n{{ raise_exception('boom') }}").find("line 3"), std::string::npos);
  EXPECT_NE(error_of("a\nb\n{{ raise_exception('boom') }}").find("boom"), std::string::npos);
  EXPECT_NE(error_of("{% for x in y %}").find("line 1"), std::string::npos);
  EXPECT_NE(error_of("\n\n\n{{ 1 + 'a' }}").find("line 4"), std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("nosuchfilter"), std::string::npos);
}

TEST(ChatTemplate, RefusesFileAccess) {
  EXPECT_NE(error_of("{% include 'x.jinja' %}").find("not allowed"), std::string::npos);
  EXPECT_NE(error_of("{% import 'x' as y %}").find("not allowed"), std::string::npos);
  EXPECT_NE(error_of("{% extends 'base' %}").find("not allowed"), std::string::npos);
  // Python attribute escapes lead nowhere: there are no such attributes here.
  EXPECT_EQ(render("{{ ''.__class__ }}{{ messages.__init__ }}"), "");
}

TEST(ChatTemplate, BoundsStepsOutputAndRecursion) {
  jinja::Limits small;
  small.max_steps = 100'000;
  small.max_output_bytes = 1 << 20;
  EXPECT_NE(error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", small)
                .find("step limit"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", small).find("size limit"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000000000 }}", small).find("size limit"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nested deeper"),
            std::string::npos);
  std::string deep = std::string(100000, '(') + "1" + std::string(100000, ')');
  EXPECT_NE(error_of("{{ " + deep + " }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '[') + " }}").find("not closed"), std::string::npos);
  EXPECT_NE(error_of("{{ range(100000000) }}").find("too large"), std::string::npos);
}

TEST(ChatTemplate, UndefinedBehavesAsInJinja2) {
  EXPECT_EQ(render("[{{ nothing }}]{{ nothing is defined }}{{ nothing | length }}{% for x in nothing %}x{% endfor %}"),
            "[]False0");
  EXPECT_NE(error_of("{{ nothing.attr }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nothing + 1 }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_EQ(render("{{ messages[5] is defined }}{{ messages[0].nope is defined }}", nlohmann::ordered_json::array({{{"role", "user"}}})),
            "FalseFalse");
}

TEST(ChatTemplate, LoopScopeAndNamespace) {
  // As in Jinja2: a set inside a loop does not survive the iteration; a namespace does.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}"), "2");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  EXPECT_NE(error_of("{% set d = {} %}{% set d.x = 1 %}").find("non-namespace"), std::string::npos);
  // Nesting namespaces works; a namespace reachable from itself is refused (it would be a
  // reference cycle, never freed).
  EXPECT_EQ(render("{% set a = namespace(v=1) %}{% set b = namespace() %}{% set b.a = a %}{{ b.a.v }}"), "1");
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.me = ns %}").find("inside itself"), std::string::npos);
  EXPECT_NE(error_of("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.l = [1, {'k': b}] %}")
                .find("inside itself"), std::string::npos);
}

TEST(ChatTemplate, WhitespaceControlAsTransformers) {
  EXPECT_EQ(render("a\n{% if true %}\nb\n{% endif %}\nc\n"), "a\nb\nc");  // trim/lstrip, last \n dropped
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(render("  {{ 'x' }}"), "  x");
  EXPECT_EQ(render("{# comment #}\nx"), "x");
}

}  // namespace
}  // namespace tetra::tok
