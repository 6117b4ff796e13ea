// The JSON bodies OpenAI clients expect: streamed chunks, final responses, usage, logprobs.
// Pure functions of their inputs, shared by streaming and non-streaming paths so the two give
// the same text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "server/openai_schema.h"
#include "tokenizer/tokenizer.h"

namespace tetra::server {

struct ResponseHeader {
  Endpoint endpoint = Endpoint::Completions;
  std::string id;     // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

// Logprobs of the tokens one choice produced, in the endpoint's format.
class LogprobsBuilder {
 public:
  LogprobsBuilder(Endpoint endpoint, const tok::Tokenizer& tokenizer) : endpoint_(endpoint), tokenizer_(&tokenizer) {}
  // `text_offset`: bytes of text emitted before this token (completions only).
  void add(const runtime::TokenOutput& t, int64_t text_offset);
  bool empty() const { return count_ == 0; }
  // Returns the accumulated object and starts a new one (for the next streamed chunk).
  nlohmann::json take();

 private:
  std::string token_text(int32_t id) const;
  Endpoint endpoint_;
  const tok::Tokenizer* tokenizer_;
  nlohmann::json tokens_ = nlohmann::json::array(), logprobs_ = nlohmann::json::array(),
                 top_ = nlohmann::json::array(), offsets_ = nlohmann::json::array(),
                 content_ = nlohmann::json::array();
  size_t count_ = 0;
};

nlohmann::json usage_json(const Usage& u);

// What one streamed event adds to a choice: text (content), and for chat the reasoning and
// tool calls split off by the output parsers.
struct ChoiceDelta {
  std::string text;
  std::string reasoning;
  nlohmann::json tool_calls;  // null or [{"index", "id", "type", "function": {"name", "arguments"}}]
};

// One `data:` event for choice `index` (finish_reason null while it runs).
std::string sse_chunk(const ResponseHeader& h, int index, const ChoiceDelta& delta, bool first,
                      const nlohmann::json& logprobs, const char* finish_reason, bool with_usage_field);
std::string sse_usage_chunk(const ResponseHeader& h, const Usage& u);
std::string sse_error(const ApiError& e);
std::string sse_done();

struct FinalChoice {
  std::string text;
  std::optional<std::string> reasoning;  // set: the message carries reasoning_content
  nlohmann::json tool_calls;             // null or a non-empty array
  nlohmann::json logprobs;  // null when not asked
  const char* finish_reason = "stop";
};
std::string final_body(const ResponseHeader& h, const std::vector<FinalChoice>& choices, const Usage& u);

// JSON text with invalid UTF-8 replaced (token pieces may be partial characters).
std::string dump_json(const nlohmann::json& j);

}  // namespace tetra::server
