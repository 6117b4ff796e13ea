#include "server/responses.h"

namespace tetra::server {

using nlohmann::json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string LogprobsBuilder::token_text(int32_t id) const {
  auto bytes = tokenizer_->token_bytes(id);
  return bytes ? std::string(*bytes) : std::string();
}

void LogprobsBuilder::add(const runtime::TokenOutput& t, int64_t text_offset) {
  ++count_;
  const std::string text = token_text(t.token);
  if (endpoint_ == Endpoint::Completions) {
    tokens_.push_back(text);
    logprobs_.push_back(t.logprob);
    offsets_.push_back(text_offset);
    json top = json::object();
    for (const auto& [id, lp] : t.top_logprobs) top[token_text(id)] = lp;
    top_.push_back(std::move(top));
    return;
  }
  auto entry = [](const std::string& s, float lp) {
    json bytes = json::array();
    for (unsigned char c : s) bytes.push_back(int(c));
    return json{{"token", s}, {"logprob", lp}, {"bytes", std::move(bytes)}};
  };
  json e = entry(text, t.logprob);
  json top = json::array();
  for (const auto& [id, lp] : t.top_logprobs) top.push_back(entry(token_text(id), lp));
  e["top_logprobs"] = std::move(top);
  content_.push_back(std::move(e));
}

json LogprobsBuilder::take() {
  json out;
  if (endpoint_ == Endpoint::Completions) {
    out = {{"tokens", std::move(tokens_)}, {"token_logprobs", std::move(logprobs_)},
           {"top_logprobs", std::move(top_)}, {"text_offset", std::move(offsets_)}};
  } else {
    out = {{"content", std::move(content_)}};
  }
  tokens_ = logprobs_ = top_ = offsets_ = content_ = json::array();
  count_ = 0;
  return out;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {
json envelope(const ResponseHeader& h, bool chunk) {
  const char* object = h.endpoint == Endpoint::Completions ? "text_completion"
                       : chunk                               ? "chat.completion.chunk"
                                                             : "chat.completion";
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}
}  // namespace

std::string sse_chunk(const ResponseHeader& h, int index, const ChoiceDelta& d, bool first,
                      const json& logprobs, const char* finish_reason, bool with_usage_field) {
  json choice = {{"index", index}};
  if (h.endpoint == Endpoint::Completions) {
    choice["text"] = d.text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!d.text.empty() || first) delta["content"] = d.text;
    // Both names clients read: reasoning_content (vLLM before 0.11, DeepSeek's API) and reasoning.
    if (!d.reasoning.empty()) delta["reasoning_content"] = delta["reasoning"] = d.reasoning;
    if (d.tool_calls.is_array() && !d.tool_calls.empty()) delta["tool_calls"] = d.tool_calls;
    choice["delta"] = std::move(delta);
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  json body = envelope(h, true);
  body["choices"] = json::array({std::move(choice)});
  if (with_usage_field) body["usage"] = nullptr;
  return "data: " + dump_json(body) + "\n\n";
}

std::string sse_usage_chunk(const ResponseHeader& h, const Usage& u) {
  json body = envelope(h, true);
  body["choices"] = json::array();
  body["usage"] = usage_json(u);
  return "data: " + dump_json(body) + "\n\n";
}

std::string sse_error(const ApiError& e) { return "data: " + error_body(e) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string final_body(const ResponseHeader& h, const std::vector<FinalChoice>& choices, const Usage& u) {
  json body = envelope(h, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const FinalChoice& c = choices[i];
    json choice = {{"index", i}};
    if (h.endpoint == Endpoint::Completions) choice["text"] = c.text;
    else {
      const bool calls = c.tool_calls.is_array() && !c.tool_calls.empty();
      json message = {{"role", "assistant"}, {"content", calls && c.text.empty() ? json(nullptr) : json(c.text)}};
      if (c.reasoning)
        message["reasoning_content"] = message["reasoning"] = c.reasoning->empty() ? json(nullptr) : json(*c.reasoning);
      if (calls) message["tool_calls"] = c.tool_calls;
      choice["message"] = std::move(message);
    }
    choice["logprobs"] = c.logprobs;
    choice["finish_reason"] = c.finish_reason;
    list.push_back(std::move(choice));
  }
  body["choices"] = std::move(list);
  body["usage"] = usage_json(u);
  return dump_json(body);
}

}  // namespace tetra::server
