// tetra serve: the OpenAI-compatible server. It listens first (health 503 while the model
// loads), then runs the engine on its own thread and the HTTP server on a few I/O threads.
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "commands.h"
#include "device_options.h"
#include "progress.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace tetra::cli {
namespace {

// "256M", "2G", "1048576": bytes with an optional binary suffix.
int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string suffix = text.substr(used);
  double scale = 1;
  if (suffix == "K" || suffix == "KiB" || suffix == "k") scale = 1024.0;
  else if (suffix == "M" || suffix == "MiB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) used = 0;
  TETRA_CHECK(used > 0 && v > 0 && v * scale <= double(int64_t(1) << 50),
              "--kv-memory must be a size such as 256M or 2G, got '", text, "'");
  return int64_t(v * scale);
}

// Thousands of streams need thousands of descriptors: take the hard limit.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CLI::App app{"Serve a model over an OpenAI-compatible HTTP API.", "tetra serve"};
  std::string model_dir, host = "127.0.0.1", kv_memory, served_name;
  DeviceFlags dev;
  int port = 30000, tp = 1, ep = 1, http_threads = 2;
  runtime::EngineConfig engine_config;
  double shutdown_timeout = 30, read_timeout = 30;
  int64_t context_length = 0;
  app.add_option("--model", model_dir, "model folder (config.json, safetensors, tokenizer.json)")->required();
  app.add_option("--host", host, "address to listen on");
  app.add_option("--port", port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  add_device_flags(app, dev);
  app.add_option("--max-running-requests", engine_config.max_running_requests, "requests in the running batch")
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-queued-requests", engine_config.max_queued_requests,
                 "requests waiting beyond the running batch; more are refused with 429")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--num-continuous-decode-steps", engine_config.num_continuous_decode_steps,
                 "decode steps run back to back before scheduling again")->check(CLI::Range(1, 64));
  app.add_option("--chunked-prefill-size", engine_config.chunked_prefill_size, "prompt tokens per step at most")
      ->check(CLI::Range(int64_t(16), int64_t(1) << 24));
  app.add_option("--mem-fraction-static", engine_config.mem_fraction_static,
                 "GPU: the fraction of its memory for the weights and the KV cache together")
      ->check(CLI::Range(0.01, 1.0));
  // The last --kv-memory given wins, so a wrapper's default can be overridden after it.
  app.add_option("--kv-memory", kv_memory,
                 "bytes for the KV cache (e.g. 256M, 2G); default 256M on the CPU, on a GPU what "
                 "--mem-fraction-static leaves")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--context-length", context_length, "tokens per sequence (0: the model's maximum)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  app.add_option("--served-model-name", served_name, "model name in the API (default: the folder name)");
  app.add_option("--tp", tp, "tensor-parallel size")->check(CLI::Range(1, 64));
  app.add_option("--ep", ep, "expert-parallel size")->check(CLI::Range(1, 64));
  app.add_option("--http-threads", http_threads, "HTTP I/O threads")->check(CLI::Range(1, 256));
  app.add_option("--shutdown-timeout", shutdown_timeout,
                 "seconds SIGTERM lets running requests finish (0: abort them at once)")->check(CLI::Range(0.0, 86400.0));
  app.add_option("--read-timeout", read_timeout, "seconds a client has to send a whole request")
      ->check(CLI::Range(0.1, 3600.0));
  std::string tool_parser = "auto", reasoning_parser;
  app.add_option("--tool-call-parser", tool_parser,
                 "tool-call format of the model's output: hermes (Qwen3), glm45 (GLM-4.5+, GLM-5), deepseek_v3, "
                 "kimi_k2; auto: from the model family; none: no tool calls")
      ->check(CLI::IsMember({"auto", "none", "hermes", "glm45", "glm47", "deepseek_v3", "kimi_k2"}));
  bool auto_tool_choice = false;
  app.add_flag("--enable-auto-tool-choice", auto_tool_choice, "accepted for vLLM compatibility: tool_choice \"auto\" works "
                                            "whenever a tool-call parser is set");
  app.add_option("--reasoning-parser", reasoning_parser,
                 "split <think>...</think> into reasoning_content: qwen3, glm45, deepseek_r1 (default: off)")
      ->check(CLI::IsMember({"qwen3", "glm45", "deepseek_r1"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  TETRA_CHECK(tp == 1, "--tp ", tp, " is not supported yet; tetra serve runs on one device (--tp 1)");
  TETRA_CHECK(ep == 1, "--ep ", ep, " is not supported yet; tetra serve runs on one device (--ep 1)");
  const std::filesystem::path dir(model_dir);
  TETRA_CHECK(std::filesystem::is_directory(dir), "model folder ", dir.string(), " does not exist");
  TETRA_CHECK(std::filesystem::exists(dir / "tokenizer.json"), "tetra serve needs ",
              (dir / "tokenizer.json").string(), " to turn text into tokens");
  if (!kv_memory.empty()) engine_config.kv_memory_bytes = parse_bytes(kv_memory);
  engine_config.max_context = context_length;
  if (const char* v = std::getenv("TETRA_TESTING_FAIL_STEP"); v && *v) {
    // Tests only (RELIABILITY cases 24 and 25): make that engine step fail like a device fault.
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    TETRA_CHECK(*end == '\0' && n >= 0, "TETRA_TESTING_FAIL_STEP must be a step number >= 0, not '", v, "'");
    engine_config.testing_fail_step = n;
    std::fprintf(stderr, "tetra serve: TETRA_TESTING_FAIL_STEP=%lld: step %lld will fail (testing)\n", n, n);
  }
  std::optional<server::TestingScript> testing_script;
  if (const char* v = std::getenv("TETRA_TESTING_SCRIPT"); v && *v) {
    // Tests only: scripted replies instead of the model's tokens (server/testing_script.h).
    testing_script = server::TestingScript::load(v);
    std::fprintf(stderr, "tetra serve: TETRA_TESTING_SCRIPT=%s: %zu scripted replies replace the model's (testing)\n",
                 v, testing_script->size());
  }
  if (served_name.empty()) served_name = std::filesystem::absolute(dir).lexically_normal().filename().string();
  if (served_name.empty()) served_name = std::filesystem::absolute(dir).parent_path().filename().string();
  raise_fd_limit();

  // The device answers (or the command ends with one sentence) before the server listens.
  auto backend = ops::make_backend(backend_options(dev));
  std::fprintf(stderr, "tetra serve: backend %s\n", backend->name().c_str());

  server::Server srv(server::ServerOptions{.host = host,
                                           .port = port,
                                           .http_threads = http_threads,
                                           .shutdown_timeout_s = shutdown_timeout,
                                           .read_timeout_s = read_timeout});
  srv.start();
  std::fprintf(stderr, "tetra serve: listening on http://%s:%d, loading %s\n", host.c_str(), srv.port(),
               dir.string().c_str());

  tok::Tokenizer tokenizer = tok::Tokenizer::load(dir);
  Progress progress("loading " + dir.filename().string());
  model::LoadOptions load_options;
  load_options.on_progress = [&](const model::LoadStats& s) { progress.update(s.tensors, s.bytes); };
  load_options.dummy = dev.load_format == "dummy";
  auto model = model::load_model(dir, *backend, load_options);
  progress.finish(model->load_stats().tensors, model->load_stats().bytes);
  const ModelConfig& mc = model->config();
  runtime::Engine engine(*model, *backend, engine_config);
  std::thread engine_thread([&engine] {
    try {
      engine.run();
    } catch (const std::exception& e) {
      // The engine cannot continue; a supervisor restarts the process.
      std::fprintf(stderr, "tetra serve: engine failed: %s\n", e.what());
      std::_Exit(1);
    }
  });
  const int64_t max_context = engine.config().max_context > 0 ? engine.config().max_context
                              : context_length > 0             ? std::min(context_length, mc.max_position_embeddings)
                                                               : mc.max_position_embeddings;
  const std::optional<server::ToolFormat> tool_format =
      tool_parser == "auto" ? server::tool_format_for_family(mc.model_type,
                                                             tokenizer.token_to_id("<|tool_call_begin|>").has_value())
      : tool_parser == "none" ? std::nullopt
                              : server::tool_format_named(tool_parser);
  const std::optional<server::ReasoningFormat> reasoning_format =
      reasoning_parser.empty() ? std::nullopt : server::reasoning_format_named(reasoning_parser);
  std::fprintf(stderr, "tetra serve: tool-call parser %s, reasoning parser %s\n",
               tool_format ? server::tool_format_name(*tool_format) : "none",
               reasoning_format ? server::reasoning_format_name(*reasoning_format) : "none");
  srv.set_ready({.engine = &engine,
                 .tokenizer = &tokenizer,
                 .model_name = served_name,
                 .max_context = max_context,
                 .vocab_size = mc.vocab_size,
                 .tool_format = tool_format,
                 .reasoning_format = reasoning_format,
                 .testing_script = testing_script ? &*testing_script : nullptr});
  const runtime::EngineStats stats = engine.stats();
  std::fprintf(stderr, "tetra serve: ready: %s, context %lld tokens, %lld KV blocks, http://%s:%d/v1\n",
               served_name.c_str(), static_cast<long long>(max_context),
               static_cast<long long>(stats.kv_blocks_total), host.c_str(), srv.port());

  const int rc = srv.wait();
  engine.stop();
  engine_thread.join();
  std::fprintf(stderr, "tetra serve: stopped\n");
  return rc;
}

}  // namespace tetra::cli
