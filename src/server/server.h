// The OpenAI-compatible HTTP server: asynchronous (Boost.Beast on a few threads), so thousands
// of streaming connections cost sockets and buffers, not threads. It listens before the model
// is loaded (health answers 503 until set_ready) and drains on SIGTERM.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/access_control.h"
#include "server/reasoning_parser.h"
#include "server/testing_script.h"
#include "server/tool_parser.h"
#include "tokenizer/tokenizer.h"

namespace tetra::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;                    // 0: any free port (see Server::port())
  int http_threads = 2;
  double shutdown_timeout_s = 30;      // SIGTERM: let running requests finish this long; 0 = abort
  double read_timeout_s = 30;          // a whole request (headers + body) must arrive within it
  double write_timeout_s = 60;         // a client that does not read for this long is dropped
  double idle_timeout_s = 60;          // keep-alive connection with no request
  size_t max_body_bytes = 8u << 20;    // larger bodies: 413, read no further
  size_t max_header_bytes = 16u << 10; // larger headers: 431
  int max_connections = 16384;         // beyond it new connections are closed at once
  std::vector<std::string> api_keys;   // non-empty: /v1/* needs "Authorization: Bearer <one of them>"
  CorsOptions cors;                    // origins empty: no CORS headers, preflights refused
  bool log_requests = true;            // one access line per request (not /health, /metrics)
  double log_stats_interval_s = 10;    // throughput line while busy; 0: never
  std::string version;                 // GET /version answers {"version": this}
};

// Sampling values for requests that set none: the model's generation_config.json, as vLLM's
// --generation-config auto takes them. Unset: OpenAI's defaults (temperature 1, top_p 1, all
// tokens) and vLLM's (repetition_penalty 1, off).
struct SamplingDefaults {
  std::optional<float> temperature, top_p, repetition_penalty;
  std::optional<int> top_k;
};

// What the server needs once the model is loaded; the pointees outlive the server's use.
struct ServingContext {
  runtime::Engine* engine = nullptr;
  const tok::Tokenizer* tokenizer = nullptr;
  std::vector<std::string> model_names;  // --served-model-name; the first is the one responses carry
  int64_t max_context = 0;  // prompt + generated tokens per sequence
  int64_t vocab_size = 0;   // the model's (embedding) vocabulary
  SamplingDefaults sampling_defaults;
  std::optional<ToolFormat> tool_format;            // --tool-call-parser; unset: no tool calls
  std::optional<ReasoningFormat> reasoning_format;  // --reasoning-parser; unset: no split
  const TestingScript* testing_script = nullptr;    // tests only (TETRA_TESTING_SCRIPT)
};

class Server {
 public:
  // Binds and listens; throws tetra::Error with one sentence if it cannot.
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // Starts the I/O threads and SIGTERM/SIGINT handling; /health answers 503 until set_ready.
  void start();
  void set_ready(ServingContext context);
  // True once a shutdown signal arrived (a loader can give up early).
  bool stopping() const;
  // Blocks until the server has drained after a signal, stop() or a failed engine step;
  // returns the exit code (1 after an engine failure, else 0).
  int wait();
  // Drains as if SIGTERM had arrived.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tetra::server
