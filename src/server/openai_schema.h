// The OpenAI request schema for /v1/completions and /v1/chat/completions: parsing and
// validation into one GenerationRequest. Every field is checked for type and range, and every
// failure is an ApiError naming the field, so the handler can answer 400 and stay up.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra::server {

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

// Thrown by request parsing and handlers; the router turns it into the response.
class ApiException : public std::runtime_error {
 public:
  explicit ApiException(ApiError e) : std::runtime_error(e.message), error(std::move(e)) {}
  ApiError error;
};

[[noreturn]] void throw_invalid(const std::string& param, const std::string& message);
std::string error_body(const ApiError& e);
ApiError unavailable_error(const std::string& message);  // 503

enum class Endpoint { Completions, ChatCompletions };

struct SchemaLimits {
  int64_t vocab_size = 0;      // prompt token ids must lie in [0, vocab_size)
  int max_n = 16;              // `n` choices per request
  int max_stop = 16;           // stop strings per request
  size_t max_stop_bytes = 256; // bytes per stop string
  int max_top_logprobs = 20;
  size_t max_messages = 4096;
  size_t max_tools = 128;
};

// tool_choice: "auto" (the model decides), "none", "required" or one named function.
enum class ToolChoice { Auto, None, Required, Named };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;
  // Completions: text or token ids; chat: messages (validated shape, rendered later).
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  nlohmann::json messages;
  bool add_generation_prompt = true;
  nlohmann::json tools;  // null, or validated: [{"type": "function", "function": {"name", ...}}]
  ToolChoice tool_choice = ToolChoice::None;  // "auto" when tools are given without a choice
  std::string tool_choice_name;               // ToolChoice::Named: the function
  bool parallel_tool_calls = true;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();  // extra template variables

  std::optional<int64_t> max_tokens;  // the smaller of max_tokens and max_completion_tokens
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // 0 = all tokens (-1 is accepted as vLLM's spelling of the same)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // vLLM's extra parameter: > 0, 1 = off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int n = 1;
  bool logprobs = false;
  int top_logprobs = 0;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;            // vLLM/SGLang extension, used by benchmarks
  bool skip_special_tokens = true;
  std::vector<std::string> ignored_fields;  // unknown fields, logged and otherwise ignored
};

// Parses a request body (already known to be a JSON object) for `endpoint`.
GenerationRequest parse_generation_request(Endpoint endpoint, const nlohmann::json& body,
                                           const SchemaLimits& limits);

}  // namespace tetra::server
