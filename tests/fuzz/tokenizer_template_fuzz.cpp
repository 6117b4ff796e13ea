// Fuzz target: parsing and rendering arbitrary chat templates under small limits; any input
// must render or throw tetra::Error, within the step, output and depth bounds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tetra::tok;
  static const ChatRequest request = [] {
    ChatRequest r;
    r.messages = nlohmann::ordered_json::parse(
        R"([{"role": "system", "content": "sys"}, {"role": "user", "content": ["a", {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "<think>x</think>y", "tool_calls": [{"function": {"name": "f", "arguments": {"k": 1.5}}}]}])");
    r.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
    return r;
  }();
  TokenizerConfig config;
  config.bos_token = "<s>";
  jinja::Limits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_call_depth = 16;
  try {
    ChatTemplate t(std::string_view(reinterpret_cast<const char*>(data), size), limits);
    (void)t.render(request, config);
  } catch (const tetra::Error&) {
  }
  return 0;
}

std::vector<std::string> tetra_fuzz_seeds() {
  return {
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
      "{%- set ns = namespace(a=1) -%}{% for x in range(3) if x is odd %}{% set ns.a = ns.a * 2 %}{% endfor %}{{ ns.a }}",
      "{% macro f(x, y=2) %}{{ x ~ y }}{% endmacro %}{{ f(1) }}{{ f(x=3, y='z') | upper }}",
      "{{ tools | tojson(indent=2) }}{{ messages[-1].tool_calls[0].function.arguments | dictsort }}",
      "{{ 'a,b'.split(',')[::-1] | join('-') }}{{ '  x '.strip() }}{{ (1, 2) }}{{ {'k': [1, none]} }}",
      "{% if messages[0].content is string and not tools %}x{% elif bos_token %}{{ bos_token }}{% else %}y{% endif %}",
      "{% set a = namespace(n=0) %}{% set b = namespace(a=a) %}{% set a.b = [b] %}{% set a.n = a.n + 1 %}{{ a.n }}",
      "{% raw %}{{ x }}{% endraw %}{# c #}{% filter lower %}ABC{% endfilter %}{% set b %}q{% endset %}{{ b }}",
  };
}
