// Request validation: types first, then ranges; the first problem found is the answer.
#include "server/openai_schema.h"

#include <cmath>
#include <limits>
#include <unordered_set>

#include "formats/json_fields.h"
#include "server/json_depth.h"

namespace tetra::server {
namespace {

using nlohmann::json;

const json* find(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> get_int(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    throw_invalid(key, std::string("'") + key + "' must be an integer, got " + json_kind(*v));
  // An unsigned value above INT64_MAX (2^63 and up) is out of range, not a wrap-around.
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw_invalid(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                           std::to_string(hi));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw_invalid(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                           std::to_string(hi) + ", got " + std::to_string(x));
  return x;
}

std::optional<double> get_number(const json& body, const char* key, double lo, double hi,
                                 bool lo_exclusive = false) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number())
    throw_invalid(key, std::string("'") + key + "' must be a number, got " + json_kind(*v));
  const double x = v->get<double>();
  const bool below = lo_exclusive ? !(x > lo) : !(x >= lo);
  if (!std::isfinite(x) || below || !(x <= hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "%s%g, %g]", lo_exclusive ? "(" : "[", lo, hi);
    throw_invalid(key, std::string("'") + key + "' must be a finite number in " + range);
  }
  return x;
}

std::optional<bool> get_bool(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    throw_invalid(key, std::string("'") + key + "' must be a boolean, got " + json_kind(*v));
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string())
    throw_invalid(key, std::string("'") + key + "' must be a string, got " + json_kind(*v));
  return v->get<std::string>();
}

std::vector<int32_t> parse_token_ids(const json& arr, const std::string& param, int64_t vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& t : arr) {
    if (!t.is_number_integer())
      throw_invalid(param, "'" + param + "' token ids must be integers");
    const bool too_big = t.is_number_unsigned() ? t.get<uint64_t>() >= uint64_t(vocab)
                                                : t.get<int64_t>() >= vocab;
    if ((!t.is_number_unsigned() && t.get<int64_t>() < 0) || too_big)
      throw_invalid(param, "'" + param + "' token ids must lie in [0, " + std::to_string(vocab) +
                               "), got " + t.dump());
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(const json& body, const SchemaLimits& limits, GenerationRequest& r) {
  const json* p = find(body, "prompt");
  if (!p) throw_invalid("prompt", "'prompt' is required");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) throw_invalid("prompt", "'prompt' must be a string, an array of token ids, "
                                               "or an array with one of those");
  if (p->empty()) throw_invalid("prompt", "'prompt' is empty");
  const json& first = (*p)[0];
  if (first.is_number()) {
    r.prompt_ids = parse_token_ids(*p, "prompt", limits.vocab_size);
    return;
  }
  if (p->size() > 1)
    throw_invalid("prompt", "one prompt per request is supported; use `n` for several choices");
  if (first.is_string()) {
    r.prompt_text = first.get<std::string>();
  } else if (first.is_array()) {
    if (first.empty()) throw_invalid("prompt", "'prompt' is empty");
    r.prompt_ids = parse_token_ids(first, "prompt", limits.vocab_size);
  } else {
    throw_invalid("prompt", "'prompt' must be a string, an array of token ids, or an array with one of those");
  }
}

// An assistant turn's tool calls (as an earlier response returned them) and reasoning.
void parse_assistant_extras(const json& msg, const std::string& where, json& out) {
  // Templates read reasoning_content; vLLM's newer name `reasoning` is taken as the same.
  for (const char* key : {"reasoning_content", "reasoning"}) {
    auto rc = msg.find(key);
    if (rc == msg.end() || rc->is_null()) continue;
    if (!rc->is_string()) throw_invalid(where + "." + key, "'" + where + "." + key + "' must be a string");
    if (!out.contains("reasoning_content")) out["reasoning_content"] = *rc;
  }
  auto calls = msg.find("tool_calls");
  if (calls == msg.end() || calls->is_null()) return;
  if (!calls->is_array()) throw_invalid(where + ".tool_calls", "'" + where + ".tool_calls' must be an array");
  json list = json::array();
  for (size_t j = 0; j < calls->size(); ++j) {
    const json& c = (*calls)[j];
    const std::string at = where + ".tool_calls[" + std::to_string(j) + "]";
    if (!c.is_object()) throw_invalid(at, "'" + at + "' must be an object");
    if (c.contains("type") && c["type"] != "function") throw_invalid(at + ".type", "'" + at + ".type' must be \"function\"");
    if (c.contains("id") && !c["id"].is_string()) throw_invalid(at + ".id", "'" + at + ".id' must be a string");
    auto f = c.find("function");
    if (f == c.end() || !f->is_object()) throw_invalid(at + ".function", "'" + at + ".function' must be an object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      throw_invalid(at + ".function.name", "'" + at + ".function.name' must be a non-empty string");
    const json* args_in = f->contains("arguments") ? &(*f)["arguments"] : nullptr;
    // Arguments are a JSON object written as a string (OpenAI); templates get the object.
    if (args_in && args_in->is_string()) {
      json parsed = json::parse(args_in->get_ref<const std::string&>(), nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        throw_invalid(at + ".function.arguments", "'" + at + ".function.arguments' must be a JSON object encoded as a string");
      if (json_nested_deeper_than(parsed))
        throw_invalid(at + ".function.arguments", "'" + at + ".function.arguments' is nested deeper than " +
                                                      std::to_string(kMaxJsonNesting) + " levels");
    } else if (args_in && (!args_in->is_object() || json_nested_deeper_than(*args_in))) {
      throw_invalid(at + ".function.arguments", "'" + at + ".function.arguments' must be a string");
    }
    json args = args_in ? *args_in : json("{}");
    json call = {{"type", "function"}, {"function", {{"name", *name}, {"arguments", args}}}};
    if (c.contains("id")) call["id"] = c["id"];
    list.push_back(std::move(call));
  }
  out["tool_calls"] = std::move(list);
}

void parse_messages(const json& body, const SchemaLimits& limits, GenerationRequest& r) {
  const json* m = find(body, "messages");
  if (!m) throw_invalid("messages", "'messages' is required");
  if (!m->is_array()) throw_invalid("messages", std::string("'messages' must be an array, got ") + json_kind(*m));
  if (m->empty()) throw_invalid("messages", "'messages' must not be empty");
  if (m->size() > limits.max_messages)
    throw_invalid("messages", "'messages' has more than " + std::to_string(limits.max_messages) + " entries");
  static const std::unordered_set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  r.messages = json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) throw_invalid(where, "'" + where + "' must be an object");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string() || !roles.count(role->get<std::string>()))
      throw_invalid(where + ".role", "'" + where + ".role' must be one of system, developer, user, assistant, tool");
    json out = {{"role", *role}};
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      if (*role != "assistant") throw_invalid(where + ".content", "'" + where + ".content' is required");
      out["content"] = "";
    } else if (content->is_string()) {
      out["content"] = *content;
    } else if (content->is_array()) {
      // Text parts are joined with newlines, as vLLM does; other part types need modalities we lack.
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw_invalid(where + ".content", "'" + where + ".content' parts must be {\"type\": \"text\", \"text\": string}");
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else {
      throw_invalid(where + ".content", "'" + where + ".content' must be a string or an array of text parts");
    }
    if (auto name = msg.find("name"); name != msg.end() && name->is_string()) out["name"] = *name;
    if (*role == "assistant") parse_assistant_extras(msg, where, out);
    if (auto id = msg.find("tool_call_id"); id != msg.end() && !id->is_null()) {
      if (!id->is_string()) throw_invalid(where + ".tool_call_id", "'" + where + ".tool_call_id' must be a string");
      out["tool_call_id"] = *id;
    }
    r.messages.push_back(std::move(out));
  }
}

void parse_stop(const json& body, const SchemaLimits& limits, GenerationRequest& r) {
  const json* s = find(body, "stop");
  if (!s) return;
  auto add = [&](const json& v) {
    if (!v.is_string()) throw_invalid("stop", "'stop' must be a string or an array of strings");
    std::string text = v.get<std::string>();
    if (text.empty()) throw_invalid("stop", "'stop' strings must not be empty");
    if (text.size() > limits.max_stop_bytes)
      throw_invalid("stop", "'stop' strings must be at most " + std::to_string(limits.max_stop_bytes) + " bytes");
    r.stop.push_back(std::move(text));
  };
  if (s->is_array()) {
    if (s->size() > size_t(limits.max_stop))
      throw_invalid("stop", "'stop' takes at most " + std::to_string(limits.max_stop) + " strings");
    for (const json& v : *s) add(v);
  } else {
    add(*s);
  }
}

// Fields we know but do not implement: refuse rather than silently change the meaning.
void refuse_unsupported(const json& body, const SchemaLimits& limits) {
  if (auto b = get_int(body, "best_of", 1, 1'000'000); b && *b != 1)
    throw_invalid("best_of", "'best_of' other than 1 is not supported");
  if (auto e = get_bool(body, "echo"); e && *e) throw_invalid("echo", "'echo' is not supported");
  if (auto s = get_string(body, "suffix"); s && !s->empty()) throw_invalid("suffix", "'suffix' is not supported");
  if (const json* lb = find(body, "logit_bias")) {
    if (!lb->is_object()) throw_invalid("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(it.key(), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != it.key().size() || id < 0 || id >= limits.vocab_size)
        throw_invalid("logit_bias", "'logit_bias' keys must be token ids in [0, " +
                                        std::to_string(limits.vocab_size) + "), got '" + it.key() + "'");
      if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) ||
          std::fabs(it.value().get<double>()) > 100)
        throw_invalid("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
    }
    if (!lb->empty()) throw_invalid("logit_bias", "'logit_bias' is not supported yet");
  }
  if (const json* rf = find(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw_invalid("response_format", "'response_format' must be an object with a string 'type'");
    if ((*rf)["type"] != "text")
      throw_invalid("response_format", "'response_format' of type " + (*rf)["type"].dump() + " is not supported");
  }
}

void parse_tools(const json& body, const SchemaLimits& limits, GenerationRequest& r) {
  if (const json* tools = find(body, "tools")) {
    if (!tools->is_array()) throw_invalid("tools", std::string("'tools' must be an array, got ") + json_kind(*tools));
    if (tools->size() > limits.max_tools)
      throw_invalid("tools", "'tools' takes at most " + std::to_string(limits.max_tools) + " functions");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) throw_invalid(at, "'" + at + "' must be an object");
      if (json_nested_deeper_than(t))
        throw_invalid(at, "'" + at + "' is nested deeper than " + std::to_string(kMaxJsonNesting) + " levels");
      // `type` may be left out: "function" is the only kind (and vLLM's default).
      if (t.contains("type") && t["type"] != "function")
        throw_invalid(at + ".type", "'" + at + ".type' must be \"function\"");
      auto f = t.find("function");
      if (f == t.end() || !f->is_object()) throw_invalid(at + ".function", "'" + at + ".function' must be an object");
      auto name = f->find("name");
      if (name == f->end() || !name->is_string() || name->get_ref<const std::string&>().empty() ||
          name->get_ref<const std::string&>().size() > 256)
        throw_invalid(at + ".function.name", "'" + at + ".function.name' must be a non-empty string of at most 256 bytes");
      if (f->contains("description") && !(*f)["description"].is_string() && !(*f)["description"].is_null())
        throw_invalid(at + ".function.description", "'" + at + ".function.description' must be a string");
      if (f->contains("parameters") && !(*f)["parameters"].is_object() && !(*f)["parameters"].is_null())
        throw_invalid(at + ".function.parameters", "'" + at + ".function.parameters' must be a JSON Schema object");
      if (f->contains("strict") && !(*f)["strict"].is_boolean() && !(*f)["strict"].is_null())
        throw_invalid(at + ".function.strict", "'" + at + ".function.strict' must be a boolean");
    }
    if (!tools->empty()) r.tools = *tools;
  }
  const bool have_tools = !r.tools.is_null();
  r.tool_choice = have_tools ? ToolChoice::Auto : ToolChoice::None;
  if (const json* choice = find(body, "tool_choice")) {
    const char* shape = "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}";
    if (choice->is_string()) {
      const std::string& c = choice->get_ref<const std::string&>();
      if (c == "none") r.tool_choice = ToolChoice::None;
      else if (c == "auto") r.tool_choice = have_tools ? ToolChoice::Auto : ToolChoice::None;
      else if (c == "required") r.tool_choice = ToolChoice::Required;
      else throw_invalid("tool_choice", shape);
    } else if (choice->is_object()) {
      const json* f = find(*choice, "function");
      if ((choice->contains("type") && (*choice)["type"] != "function") || !f || !f->is_object() || !f->contains("name") ||
          !(*f)["name"].is_string())
        throw_invalid("tool_choice", shape);
      r.tool_choice = ToolChoice::Named;
      r.tool_choice_name = (*f)["name"].get<std::string>();
    } else {
      throw_invalid("tool_choice", shape);
    }
    if ((r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) && !have_tools)
      throw_invalid("tool_choice", std::string(r.tool_choice == ToolChoice::Named ? "'tool_choice' names a function"
                                                                                  : "'tool_choice' is \"required\"") +
                                       " but 'tools' is empty or missing");
    if (r.tool_choice == ToolChoice::Named) {
      bool known = false;
      for (const json& t : r.tools) known = known || t["function"]["name"] == r.tool_choice_name;
      if (!known)
        throw_invalid("tool_choice", "'tool_choice' names function '" + r.tool_choice_name.substr(0, 256) +
                                         "', which is not in 'tools'");
    }
  }
  if (auto p = get_bool(body, "parallel_tool_calls")) r.parallel_tool_calls = *p;
  if (const json* kw = find(body, "chat_template_kwargs")) {
    if (!kw->is_object() || json_nested_deeper_than(*kw))
      throw_invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object nested at most " +
                                                std::to_string(kMaxJsonNesting) + " levels");
    // The request's own fields set these; a keyword may not replace them.
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})
      if (kw->contains(reserved))
        throw_invalid("chat_template_kwargs", std::string("'chat_template_kwargs' may not set '") + reserved + "'");
    r.chat_template_kwargs = *kw;
  }
}

}  // namespace

void throw_invalid(const std::string& param, const std::string& message) {
  throw ApiException(ApiError{.status = 400, .message = message, .param = param});
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json({{"error", err}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError unavailable_error(const std::string& message) {
  return ApiError{.status = 503, .message = message, .type = "unavailable_error"};
}

GenerationRequest parse_generation_request(Endpoint endpoint, const json& body,
                                           const SchemaLimits& limits) {
  static const std::unordered_set<std::string> known = {
      "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
      "top_k", "seed", "stop", "n", "logprobs", "top_logprobs", "stream", "stream_options",
      "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens", "best_of",
      "echo", "suffix", "logit_bias", "response_format", "tools", "tool_choice",
      "add_generation_prompt", "parallel_tool_calls", "chat_template_kwargs"};
  GenerationRequest r;
  r.endpoint = endpoint;
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!known.count(it.key())) r.ignored_fields.push_back(it.key());

  if (auto m = get_string(body, "model")) r.model = *m;
  if (endpoint == Endpoint::Completions) {
    parse_prompt(body, limits, r);
    if (const json* tools = find(body, "tools"); tools && (!tools->is_array() || !tools->empty()))
      throw_invalid("tools", "'tools' needs /v1/chat/completions");
  } else {
    if (body.contains("prompt")) throw_invalid("prompt", "chat completions take 'messages', not 'prompt'");
    parse_messages(body, limits, r);
    if (auto g = get_bool(body, "add_generation_prompt")) r.add_generation_prompt = *g;
    parse_tools(body, limits, r);
  }
  refuse_unsupported(body, limits);

  constexpr int64_t kMaxTokens = int64_t(1) << 31;
  auto max_tokens = get_int(body, "max_tokens", 1, kMaxTokens);
  auto max_completion = get_int(body, "max_completion_tokens", 1, kMaxTokens);
  // Both given: the smaller wins (documented in the README).
  if (max_tokens && max_completion) r.max_tokens = std::min(*max_tokens, *max_completion);
  else if (max_tokens) r.max_tokens = max_tokens;
  else r.max_tokens = max_completion;

  if (auto t = get_number(body, "temperature", 0.0, 2.0)) r.temperature = float(*t);
  if (auto p = get_number(body, "top_p", 0.0, 1.0, /*lo_exclusive=*/true)) r.top_p = float(*p);
  if (auto k = get_int(body, "top_k", -1, 1 << 20)) r.top_k = *k < 0 ? 0 : int(*k);
  if (auto p = get_number(body, "presence_penalty", -2.0, 2.0)) r.presence_penalty = float(*p);
  if (auto f = get_number(body, "frequency_penalty", -2.0, 2.0)) r.frequency_penalty = float(*f);
  if (const json* v = find(body, "repetition_penalty")) {
    // vLLM's range, finite and above 0, for the float the sampler takes: no upper bound but
    // the float's largest value, and nothing that rounds to 0.
    if (!v->is_number())
      throw_invalid("repetition_penalty", std::string("'repetition_penalty' must be a number, got ") + json_kind(*v));
    const double x = v->get<double>();
    if (!(x > 0 && x <= double(std::numeric_limits<float>::max()) && float(x) > 0))
      throw_invalid("repetition_penalty", "'repetition_penalty' must be greater than 0 (1 is off) and a finite "
                                          "32-bit float, got " + v->dump());
    r.repetition_penalty = float(x);
  }
  if (const json* s = find(body, "seed")) {
    // Any 64-bit integer, negative ones taken modulo 2^64 (OpenAI's seed is a signed int64).
    if (!s->is_number_integer()) throw_invalid("seed", std::string("'seed' must be an integer, got ") + json_kind(*s));
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : uint64_t(s->get<int64_t>());
  }
  parse_stop(body, limits, r);
  if (auto n = get_int(body, "n", 1, limits.max_n)) r.n = int(*n);

  if (endpoint == Endpoint::Completions) {
    // Completions: `logprobs` is the number of alternatives per token (0 = the chosen one only).
    if (auto lp = get_int(body, "logprobs", 0, limits.max_top_logprobs)) {
      r.logprobs = true;
      r.top_logprobs = int(*lp);
    }
  } else {
    if (auto lp = get_bool(body, "logprobs")) r.logprobs = *lp;
    if (auto top = get_int(body, "top_logprobs", 0, limits.max_top_logprobs)) {
      if (!r.logprobs && *top > 0)
        throw_invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
      r.top_logprobs = int(*top);
    }
  }
  if (auto s = get_bool(body, "stream")) r.stream = *s;
  if (const json* so = find(body, "stream_options")) {
    if (!so->is_object()) throw_invalid("stream_options", "'stream_options' must be an object");
    if (auto u = get_bool(*so, "include_usage")) r.include_usage = *u;
  }
  if (auto e = get_bool(body, "ignore_eos")) r.ignore_eos = *e;
  if (auto s = get_bool(body, "skip_special_tokens")) r.skip_special_tokens = *s;
  return r;
}

}  // namespace tetra::server
