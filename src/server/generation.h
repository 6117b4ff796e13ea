// One HTTP generation request: its n engine requests, their text streams, and the bytes owed
// to the client. The engine thread only queues outputs here (bounded, never blocking) and
// posts one drain to the connection's strand; everything else runs on that strand.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/chat_output.h"
#include "server/openai_schema.h"
#include "server/responses.h"
#include "server/server_state.h"
#include "server/text_stream.h"

namespace tetra::server {

// What a request adds beyond its fields: how chat output is parsed, and (tests only) the
// scripted tokens that replace the model's (TestingScript).
struct GenerationExtras {
  ChatOutputOptions chat;
  std::vector<int32_t> script;  // empty: the model's own tokens
};

// Runs a closure on the owning connection's strand.
using Post = std::function<void(std::function<void()>)>;

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(ServerState& state, GenerationRequest request, std::vector<int32_t> prompt,
             int64_t max_tokens, Clock::time_point arrival, GenerationExtras extras = {});
  ~Generation();

  // Submits the n engine requests. On a refusal, aborts those already queued and throws
  // ApiException (429 queue full, 400 too long, 503 shutting down).
  void submit();
  // Attaches to the connection: outputs are handled through `post`; `wake` runs on the strand
  // whenever bytes are ready or the response is complete.
  void attach(Post post, std::function<void()> wake);

  bool streaming() const { return request_.stream; }
  // On the strand: appends the bytes ready to send (SSE events when streaming); true once the
  // response is complete (for a non-streaming request, `out` then holds the whole body).
  bool take(std::string& out);
  int status() const { return status_; }  // of a non-streaming response
  // The client went away (or a write failed): abort the engine requests now.
  void client_gone();
  // The response was written or abandoned: the drain stops waiting for it. Idempotent.
  void release();

  // What the access log says of this request (on the strand).
  struct Summary {
    std::string id;
    int64_t prompt_tokens = 0, generated_tokens = 0;
    double ttft_s = -1;  // negative: no token came
    std::string finish;  // the choices' finish reasons, comma-separated
    Clock::time_point arrival;
  };
  Summary summary() const;

 private:
  struct Choice {
    uint64_t request_id = 0;
    std::unique_ptr<TextStream> text;
    std::unique_ptr<LogprobsBuilder> logprobs;
    std::string full_text;        // everything emitted (non-streaming body, text offsets)
    std::unique_ptr<ChatOutput> chat;  // reasoning / tool-call parsing; null: text is content
    std::string reasoning, content;    // what `chat` made of full_text
    nlohmann::json tool_calls = nlohmann::json::array();
    const char* finish = nullptr; // set once this choice is done from the client's view
    bool engine_done = false;
    bool sent_first = false;
    int64_t completion_tokens = 0;
    Clock::time_point last_token;
  };
  struct Pending {
    int index;
    runtime::RequestOutput output;
  };

  void on_output(int index, const runtime::RequestOutput& out);  // engine thread
  void drain_pending();                                          // strand
  void handle(int index, const runtime::RequestOutput& out);
  ChoiceDelta parse_chat(Choice& c, const std::string& text, bool last);
  void finish_choice(Choice& c, const char* reason);
  void complete();
  void fail(const std::string& message);

  ServerState& state_;
  runtime::Engine& engine_;
  GenerationRequest request_;
  std::vector<int32_t> prompt_;
  int64_t max_tokens_;
  Clock::time_point arrival_;
  ResponseHeader header_;
  GenerationExtras extras_;
  std::vector<Choice> choices_;
  int64_t cached_tokens_ = 0;
  double ttft_s_ = -1;

  std::mutex mutex_;              // guards pending_, scheduled_, post_, overflow_
  std::deque<Pending> pending_;   // outputs from the engine thread, not yet handled
  bool scheduled_ = false;
  bool overflow_ = false;
  Post post_;
  std::function<void()> wake_;

  std::string out_;               // bytes ready for the connection
  bool complete_ = false;
  bool gone_ = false;
  int status_ = 200;
  std::atomic<bool> released_{true};
  std::atomic<bool> submitted_{false};
};

}  // namespace tetra::server
