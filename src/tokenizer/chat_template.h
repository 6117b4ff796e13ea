// Chat templates: renders a model's Jinja chat template (tokenizer_config.json `chat_template`
// or chat_template.jinja) with the variables transformers' apply_chat_template passes.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_eval.h"
#include "tokenizer/tokenizer.h"

namespace tetra::tok {

// JSON values are ordered_json: templates print dicts (tojson) in their original key order.
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content"}, ...]
  nlohmann::ordered_json tools;                  // null (None in the template) or a list
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;           // undefined in the template when unset
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template variables
};

class ChatTemplate {
 public:
  // Parses the template; throws tetra::Error naming the line of a syntax error.
  explicit ChatTemplate(std::string_view source, jinja::Limits limits = {});
  // Renders for `request`, with bos_token/eos_token from `config`. Throws tetra::Error
  // naming the line for runtime errors, including raise_exception() and exceeded limits.
  std::string render(const ChatRequest& request, const TokenizerConfig& config) const;

 private:
  jinja::Body body_;
  jinja::Limits limits_;
};

// Renders the tokenizer's own template; throws if the model ships none.
std::string render_chat(const Tokenizer& tokenizer, const ChatRequest& request);

}  // namespace tetra::tok
