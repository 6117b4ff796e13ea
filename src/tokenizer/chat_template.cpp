#include "tokenizer/chat_template.h"

#include "core/error.h"

namespace tetra::tok {

ChatTemplate::ChatTemplate(std::string_view source, jinja::Limits limits)
    : body_(jinja::parse_template(source)), limits_(limits) {}

std::string ChatTemplate::render(const ChatRequest& request, const TokenizerConfig& config) const {
  using jinja::Value;
  TETRA_CHECK(request.messages.is_array(), "chat messages must be a JSON array");
  TETRA_CHECK(request.tools.is_null() || request.tools.is_array(), "chat tools must be a JSON array");
  TETRA_CHECK(request.extra.is_object(), "extra chat template variables must be a JSON object");
  std::vector<std::pair<std::string, Value>> vars;
  vars.emplace_back("messages", Value::from_json(request.messages));
  vars.emplace_back("tools", Value::from_json(request.tools));
  vars.emplace_back("documents", Value::none());
  vars.emplace_back("add_generation_prompt", Value(request.add_generation_prompt));
  if (config.bos_token) vars.emplace_back("bos_token", Value(*config.bos_token));
  if (config.eos_token) vars.emplace_back("eos_token", Value(*config.eos_token));
  if (request.enable_thinking) vars.emplace_back("enable_thinking", Value(*request.enable_thinking));
  for (auto it = request.extra.begin(); it != request.extra.end(); ++it)
    vars.emplace_back(it.key(), Value::from_json(it.value()));
  jinja::Interpreter interpreter(limits_);
  return interpreter.render(body_, vars);
}

std::string render_chat(const Tokenizer& tokenizer, const ChatRequest& request) {
  const TokenizerConfig& config = tokenizer.config();
  TETRA_CHECK(!config.chat_template.empty(),
              "the model has no chat template (tokenizer_config.json chat_template or chat_template.jinja)");
  return ChatTemplate(config.chat_template).render(request, config);
}

}  // namespace tetra::tok
