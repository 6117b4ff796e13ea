#include "server/router.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <utility>

#include "core/error.h"
#include "server/access_control.h"
#include "server/generation.h"
#include "tokenizer/chat_template.h"

namespace tetra::server {
namespace {

using nlohmann::json;

HttpResponse json_response(int status, const json& body) {
  return HttpResponse{.status = status, .body = dump_json(body)};
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void require_serving(const ServerState& state) {
  if (state.phase.load() == Phase::Draining) throw ApiException(unavailable_error("the server is shutting down"));
  if (!state.ready()) throw ApiException(unavailable_error("the model is loading"));
}

HttpResponse health(const ServerState& state) {
  switch (state.phase.load()) {
    case Phase::Ready:
      // A forward that threw (a device fault) leaves the engine suspect: report it so a
      // supervisor can restart the process.
      if (const runtime::EngineStats s = state.context.engine->stats(); s.failed_steps > 0)
        return error_response(unavailable_error("the engine failed a step; restart the server"));
      else if (!s.ranks_failure.empty())
        return error_response(unavailable_error("the model's ranks stopped (" + s.ranks_failure + "); restart the server"));
      return json_response(200, {{"status", "ok"}});
    case Phase::Loading: return error_response(unavailable_error("the model is loading"));
    default: return error_response(unavailable_error("the server is shutting down"));
  }
}

json model_object(const ServingContext& ctx, const std::string& name) {
  return {{"id", name}, {"object", "model"}, {"created", int64_t(std::time(nullptr))}, {"owned_by", "tetra"},
          {"root", ctx.model_names.front()}, {"max_model_len", ctx.max_context}, {"vocab_size", ctx.vocab_size}};
}

ApiError model_not_found(const std::string& name) {
  return {.status = 404,
          .message = "The model `" + name.substr(0, 256) + "` does not exist.",
          .param = "model",
          .code = "model_not_found"};
}

HttpResponse models(const ServerState& state) {
  if (!state.has_context()) throw ApiException(unavailable_error("the model is loading"));
  json data = json::array();
  for (const auto& name : state.context.model_names) data.push_back(model_object(state.context, name));
  return json_response(200, {{"object", "list"}, {"data", data}});
}

// GET /v1/models/{id}: the id may hold slashes ("org/name") and is percent-decoded.
HttpResponse model(const ServerState& state, std::string_view id) {
  if (!state.has_context()) throw ApiException(unavailable_error("the model is loading"));
  std::string name;
  for (size_t i = 0; i < id.size(); ++i) {
    if (id[i] == '%' && i + 2 < id.size() && std::isxdigit(static_cast<unsigned char>(id[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(id[i + 2]))) {
      name += char(std::stoi(std::string(id.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      name += id[i];
    }
  }
  const auto& names = state.context.model_names;
  if (std::find(names.begin(), names.end(), name) == names.end()) throw ApiException(model_not_found(name));
  return json_response(200, model_object(state.context, name));
}

void append_ids(std::vector<int32_t>& ids, const tok::Tokenizer& t, std::string_view text, bool specials) {
  for (auto id : t.encode(text, {.parse_special = specials})) ids.push_back(int32_t(id));
}

std::string render(const tok::Tokenizer& tokenizer, const tok::ChatRequest& chat) {
  try {
    return tok::render_chat(tokenizer, chat);
  } catch (const Error& e) {
    throw_invalid("messages", std::string("the chat template refused the messages: ") + e.what());
  }
}

// The template writes control tokens as text, so the rendered prompt is encoded with special
// tokens parsed; but a client's own text must not become control tokens ("<|im_end|>" typed in
// a message). So client text is rendered as placeholders, and the pieces between them are
// encoded with specials, the client text without. Should the template rewrite a placeholder
// (it changed the text), the whole render is encoded as is.
std::vector<int32_t> chat_prompt_tokens(const tok::Tokenizer& tokenizer, const tok::ChatRequest& request,
                                        std::string& rendered) {
  tok::ChatRequest chat = request;
  char nonce[24];
  std::snprintf(nonce, sizeof nonce, "%016llx", static_cast<unsigned long long>(
                                                    std::chrono::steady_clock::now().time_since_epoch().count()));
  std::vector<std::string> contents, holders;
  for (auto& m : chat.messages) {
    // Assistant turns are left alone: templates rewrite them (reasoning split-off).
    if (m["role"] == "assistant" || m["content"].get_ref<const std::string&>().empty()) continue;
    holders.push_back("TETRACLIENTTEXT" + std::string(nonce) + "N" + std::to_string(holders.size()) + "E");
    contents.push_back(std::exchange(m["content"], holders.back()).get<std::string>());
  }
  const std::string text = render(tokenizer, chat);
  rendered = text;
  for (size_t i = 0; i < holders.size(); ++i) {
    const size_t p = rendered.find(holders[i]);
    if (p != std::string::npos) rendered.replace(p, holders[i].size(), contents[i]);
  }
  std::vector<std::pair<size_t, size_t>> at;  // (position, which)
  for (size_t i = 0; i < holders.size(); ++i) {
    const size_t p = text.find(holders[i]);
    if (p == std::string::npos || text.find(holders[i], p + 1) != std::string::npos) {
      at.clear();
      break;
    }
    at.emplace_back(p, i);
  }
  std::vector<int32_t> ids;
  if (at.size() != holders.size()) {
    rendered = render(tokenizer, request);
    append_ids(ids, tokenizer, rendered, true);
    return ids;
  }
  std::sort(at.begin(), at.end());
  size_t pos = 0;
  for (const auto& [p, i] : at) {
    append_ids(ids, tokenizer, std::string_view(text).substr(pos, p - pos), true);
    append_ids(ids, tokenizer, contents[i], false);
    pos = p + holders[i].size();
  }
  append_ids(ids, tokenizer, std::string_view(text).substr(pos), true);
  return ids;
}

// What the template receives, as transformers' apply_chat_template(messages, tools=..., **kwargs)
// passes it. Tool-call arguments become objects, as vLLM hands them to templates; the tools
// keep the client's key order (templates print them with tojson).
tok::ChatRequest chat_request(const GenerationRequest& r, const std::string& body) {
  tok::ChatRequest chat;
  chat.messages = r.messages;
  chat.add_generation_prompt = r.add_generation_prompt;
  chat.extra = r.chat_template_kwargs;
  for (auto& m : chat.messages)
    if (m.contains("tool_calls"))
      for (auto& c : m["tool_calls"])
        if (auto& args = c["function"]["arguments"]; args.is_string())
          args = nlohmann::ordered_json::parse(args.get<std::string>());
  if (!r.tools.is_null()) {
    chat.tools = nlohmann::ordered_json::parse(body)["tools"];
    if (r.tool_choice == ToolChoice::Named) {
      // The named function is the only one the model is shown: its call is the expected output.
      nlohmann::ordered_json only = nlohmann::ordered_json::array();
      for (const auto& t : chat.tools)
        if (t["function"]["name"] == r.tool_choice_name) only.push_back(t);
      chat.tools = std::move(only);
    }
  }
  return chat;
}

std::vector<int32_t> prompt_tokens(const ServingContext& ctx, const GenerationRequest& r, const std::string& body,
                                   std::string& rendered) {
  const tok::Tokenizer& tokenizer = *ctx.tokenizer;
  std::vector<int32_t> ids;
  if (r.endpoint == Endpoint::ChatCompletions) {
    ids = chat_prompt_tokens(tokenizer, chat_request(r, body), rendered);
  } else if (r.prompt_text) {
    // A completion prompt is the client's whole prompt, encoded as HF's tokenizer(text) and
    // vLLM encode it: special-token strings become those tokens, BOS by the tokenizer's rule.
    for (auto id : tokenizer.encode(*r.prompt_text, {.add_special_tokens = true})) ids.push_back(int32_t(id));
  } else {
    ids = r.prompt_ids;
  }
  return ids;
}

// The defaults fill only what the body leaves out (absent or null).
void apply_sampling_defaults(const SamplingDefaults& d, const json& body, GenerationRequest& r) {
  auto unset = [&](const char* key) { return !body.contains(key) || body[key].is_null(); };
  if (d.temperature && unset("temperature")) r.temperature = *d.temperature;
  if (d.top_p && unset("top_p")) r.top_p = *d.top_p;
  if (d.top_k && unset("top_k")) r.top_k = *d.top_k;
  if (d.repetition_penalty && unset("repetition_penalty")) r.repetition_penalty = *d.repetition_penalty;
}

RouteResult generate(ServerState& state, const HttpRequest& http, Endpoint endpoint) {
  require_serving(state);
  const std::string ct = lower(http.content_type);
  if (ct.rfind("application/json", 0) != 0)
    throw ApiException({.status = 415, .message = "Content-Type must be application/json"});
  if (http.body.empty()) throw_invalid("", "the request body is empty; send a JSON object");
  json body = json::parse(http.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw_invalid("", "the request body is not valid JSON");
  if (!body.is_object()) throw_invalid("", "the request body must be a JSON object");

  const ServingContext& ctx = state.context;
  SchemaLimits limits{.vocab_size = ctx.vocab_size};
  GenerationRequest request = parse_generation_request(endpoint, body, limits);
  // A request without `model` gets the first served name, as vLLM does.
  if (!request.model.empty() && std::find(ctx.model_names.begin(), ctx.model_names.end(), request.model) ==
                                    ctx.model_names.end())
    throw ApiException(model_not_found(request.model));
  apply_sampling_defaults(ctx.sampling_defaults, body, request);
  if (!request.ignored_fields.empty()) {
    // Bounded: a body of a million unknown keys must not become a million-key log line.
    std::string names;
    const auto& fields = request.ignored_fields;
    for (size_t i = 0; i < std::min<size_t>(fields.size(), 8); ++i)
      names += (i ? ", " : "") + fields[i].substr(0, 64);
    if (fields.size() > 8) names += ", ... (" + std::to_string(fields.size()) + " in all)";
    std::fprintf(stderr, "tetra serve: ignoring unknown request fields: %s\n", names.c_str());
  }

  if (request.tool_choice != ToolChoice::None && !ctx.tool_format)
    throw_invalid("tool_choice", "tool calls need a tool-call parser: start the server with --tool-call-parser "
                                 "(hermes, glm45, deepseek_v3, kimi_k2) or send \"tool_choice\": \"none\"");
  std::string rendered;
  std::vector<int32_t> prompt = prompt_tokens(ctx, request, http.body, rendered);
  const char* prompt_param = endpoint == Endpoint::Completions ? "prompt" : "messages";
  if (prompt.empty()) throw_invalid(prompt_param, "the prompt encodes to no tokens");
  const int64_t n_prompt = int64_t(prompt.size());
  if (n_prompt >= ctx.max_context)
    throw ApiException({.message = "This model's maximum context length is " + std::to_string(ctx.max_context) +
                                   " tokens and your request has " + std::to_string(n_prompt) +
                                   " input tokens; no room is left to generate",
                        .param = prompt_param, .code = "context_length_exceeded"});
  const int64_t room = ctx.max_context - n_prompt;
  int64_t max_tokens = endpoint == Endpoint::Completions ? std::min<int64_t>(16, room) : room;
  if (request.max_tokens) {
    if (*request.max_tokens > room)
      throw ApiException({.message = "'max_tokens' is too large: " + std::to_string(*request.max_tokens) +
                                     ". This model's maximum context length is " + std::to_string(ctx.max_context) +
                                     " tokens and your request has " + std::to_string(n_prompt) + " input tokens",
                          .param = "max_tokens", .code = "context_length_exceeded"});
    max_tokens = *request.max_tokens;
  }
  GenerationExtras extras;
  if (endpoint == Endpoint::ChatCompletions) {
    ChatOutputOptions& o = extras.chat;
    o.reasoning = ctx.reasoning_format;
    o.prompt_in_thinking = prompt_opens_thinking(rendered);
    if (request.tool_choice != ToolChoice::None) o.tool_format = ctx.tool_format;
    o.tools = request.tools;
    o.parallel_tool_calls = request.parallel_tool_calls;
  }
  if (ctx.testing_script) {
    const std::string& text = endpoint == Endpoint::ChatCompletions ? rendered
                              : request.prompt_text                  ? *request.prompt_text
                                                                     : std::string();
    if (const ScriptedReply* reply = ctx.testing_script->match(text))
      for (auto id : ctx.tokenizer->encode(reply->text, {.parse_special = true})) extras.script.push_back(int32_t(id));
  }
  auto g = std::make_shared<Generation>(state, std::move(request), std::move(prompt), max_tokens, http.arrival,
                                        std::move(extras));
  g->submit();
  return RouteResult{.generation = std::move(g)};
}

RouteResult dispatch(ServerState& state, const HttpRequest& req) {
  std::string path = req.target.substr(0, req.target.find('?'));
  auto method_is = [&](const char* m) {
    if (req.method != m)
      throw ApiException({.status = 405, .message = "use " + std::string(m) + " for " + path});
  };
  // A CORS preflight is answered before the key check: browsers send it without credentials.
  if (req.method == "OPTIONS" && !req.origin.empty() && !req.access_control_request_method.empty()) {
    PreflightAnswer a = cors_preflight(state.options.cors, req.origin, req.access_control_request_method,
                                       req.access_control_request_headers);
    if (!a.allowed) throw ApiException({.status = 400, .message = a.refusal});
    return {HttpResponse{.content_type = "text/plain", .body = "OK", .headers = std::move(a.headers)}};
  }
  if (path == "/health") {
    method_is("GET");
    return {health(state)};
  }
  if (path == "/version") {  // vLLM's; open like /health
    method_is("GET");
    return {json_response(200, {{"version", state.options.version}})};
  }
  if (path == "/metrics") {
    method_is("GET");
    runtime::EngineStats stats;
    if (state.has_context()) stats = state.context.engine->stats();
    return {HttpResponse{.content_type = "text/plain; version=0.0.4",
                         .body = state.metrics.render(state.has_context() ? &stats : nullptr,
                                                     state.connections.load())}};
  }
  // As vLLM: the key guards /v1/* except OPTIONS (which no route here answers but preflights).
  if (path.rfind("/v1", 0) == 0 && req.method != "OPTIONS" && !state.options.api_keys.empty() &&
      !api_key_matches(state.options.api_keys, req.authorization)) {
    throw ApiException({.status = 401,
                        .message = req.authorization.empty()
                                       ? "You didn't provide an API key. Send it in an Authorization header "
                                         "(Authorization: Bearer YOUR_KEY)."
                                       : "Incorrect API key provided.",
                        .code = "invalid_api_key"});
  }
  if (path == "/v1/models") {
    method_is("GET");
    return {models(state)};
  }
  if (path.rfind("/v1/models/", 0) == 0) {
    method_is("GET");
    return {model(state, std::string_view(path).substr(std::string_view("/v1/models/").size()))};
  }
  if (path == "/v1/completions") {
    method_is("POST");
    return generate(state, req, Endpoint::Completions);
  }
  if (path == "/v1/chat/completions") {
    method_is("POST");
    return generate(state, req, Endpoint::ChatCompletions);
  }
  throw ApiException({.status = 404, .message = "no route for " + path.substr(0, 256), .type = "not_found_error"});
}

}  // namespace

HttpResponse error_response(const ApiError& e) {
  HttpResponse r{.status = e.status, .body = error_body(e)};
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", "1");
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

RouteResult route(ServerState& state, const HttpRequest& req) {
  try {
    return dispatch(state, req);
  } catch (const ApiException& e) {
    return {error_response(e.error)};
  } catch (const Error& e) {
    return {error_response({.status = 400, .message = e.what()})};
  } catch (const std::bad_alloc&) {
    return {error_response({.status = 503, .message = "out of memory", .type = "unavailable_error"})};
  } catch (const std::exception& e) {
    return {error_response({.status = 500, .message = e.what(), .type = "server_error"})};
  }
}

}  // namespace tetra::server
