// tetra serve: the OpenAI-compatible server. It listens first (health 503 while the model
// loads), then runs the engine on its own thread and the HTTP server on a few I/O threads.
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "device_options.h"
#include "model_summary.h"
#include "parallel_flags.h"
#include "progress.h"
#include "core/error.h"
#include "core/log.h"
#include "formats/generation_config.h"
#include "formats/model_config.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "server/access_control.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_check.h"

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

double gib(int64_t bytes) { return std::round(double(bytes) / double(int64_t(1) << 30) * 100) / 100; }

// /proc/meminfo's MemAvailable (what can be allocated without swapping); 0 when unknown.
int64_t host_memory_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// --generation-config: auto (the model folder's generation_config.json), vllm (none), or a
// folder holding one. Prints which defaults it took.
server::SamplingDefaults sampling_defaults(const std::string& flag, const std::filesystem::path& model_dir,
                                           int64_t vocab_size) {
  server::SamplingDefaults d;
  if (flag == "vllm") {
    std::fprintf(stderr, "tetra serve: --generation-config vllm: no sampling defaults from generation_config.json\n");
    return d;
  }
  const std::filesystem::path dir = flag == "auto" ? model_dir : std::filesystem::path(flag);
  TETRA_CHECK(flag == "auto" || std::filesystem::is_regular_file(dir / "generation_config.json"),
              "--generation-config must be auto, vllm or a folder holding a generation_config.json; ",
              (dir / "generation_config.json").string(), " does not exist");
  const std::optional<GenerationConfig> g = load_generation_config(dir, vocab_size);
  if (!g) return d;
  std::string taken;
  auto note = [&](const char* name, double v) { taken += str_cat(taken.empty() ? "" : ", ", name, " ", v); };
  if (g->temperature) d.temperature = float(*g->temperature), note("temperature", *g->temperature);
  if (g->top_p) d.top_p = float(*g->top_p), note("top_p", *g->top_p);
  if (g->top_k) d.top_k = int(*g->top_k), note("top_k", double(*g->top_k));
  if (g->repetition_penalty)
    d.repetition_penalty = float(*g->repetition_penalty), note("repetition_penalty", *g->repetition_penalty);
  const std::string source = (dir / "generation_config.json").string();
  if (!taken.empty())
    std::fprintf(stderr,
                 "tetra serve: sampling defaults from %s: %s (a request's own values win; "
                 "--generation-config vllm ignores them)\n",
                 source.c_str(), taken.c_str());
  return d;
}

// Thousands of streams need thousands of descriptors: take the hard limit.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// With several nodes: this one joins the others (node 0 waits for them all).
std::unique_ptr<parallel::NodeGroup> join_nodes(const parallel::NodeOptions& o, const parallel::Fingerprint& f) {
  if (o.nnodes == 1) return nullptr;
  std::fprintf(stderr, "tetra serve: node %d of %d, %s %s\n", o.node_rank, o.nnodes,
               o.node_rank == 0 ? "waiting for the others at" : "joining node 0 at", o.dist_init_addr.c_str());
  auto nodes = parallel::NodeGroup::join(o, f);
  std::fprintf(stderr, "tetra serve: all %d nodes joined\n", o.nnodes);
  return nodes;
}

// This node's ranks: it joins the other nodes (with several), then loads its share of the
// model, showing progress.
std::unique_ptr<runtime::ModelRanks> load_node_ranks(const std::filesystem::path& dir, const parallel::NodeOptions& o,
                                                     const parallel::Fingerprint& fingerprint,
                                                     const ops::BackendOptions& backend_opts,
                                                     std::unique_ptr<ops::Backend> backend,
                                                     const parallel::Parallelism& par, const DeviceFlags& dev,
                                                     const std::string& hf_overrides) {
  std::unique_ptr<parallel::NodeGroup> nodes = join_nodes(o, fingerprint);
  Progress progress("loading " + dir.filename().string());
  model::LoadOptions load_options;
  load_options.on_progress = [&](const model::LoadStats& s) { progress.update(s.tensors, s.bytes); };
  load_options.dummy = dev.load_format == "dummy";
  load_options.hf_overrides = hf_overrides;
  auto ranks = runtime::load_ranks(dir, backend_opts, par, load_options, std::move(backend), {}, std::move(nodes));
  progress.finish(ranks->model().load_stats().tensors, ranks->model().load_stats().bytes);
  return ranks;
}

// A node other than node 0: no HTTP; it loads its ranks, starts as node 0 does, then runs the
// steps node 0 sends until node 0 stops (0) or is lost (1).
int serve_other_node(const std::filesystem::path& dir, const parallel::NodeOptions& o,
                     const parallel::Fingerprint& fingerprint, const ops::BackendOptions& backend_opts,
                     std::unique_ptr<ops::Backend> backend, const parallel::Parallelism& par, const DeviceFlags& dev,
                     const std::string& hf_overrides, const runtime::EngineConfig& engine_config) {
  auto ranks = load_node_ranks(dir, o, fingerprint, backend_opts, std::move(backend), par, dev, hf_overrides);
  runtime::Engine engine(*ranks, engine_config);
  std::fprintf(stderr, "tetra serve: node %d ready: ranks %d .. %d of %d, following node 0's steps\n", o.node_rank,
               ranks->first_rank(), ranks->first_rank() + ranks->size() - 1, ranks->world());
  try {
    engine.follow();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tetra serve: node %d stops: %s\n", o.node_rank, e.what());
    return 1;
  }
  std::fprintf(stderr, "tetra serve: node 0 stopped; node %d stopped\n", o.node_rank);
  return 0;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CLI::App app{"Serve a model over an OpenAI-compatible HTTP API.", "tetra serve"};
  app.option_defaults()->always_capture_default();
  std::string model_dir, host = "127.0.0.1", kv_memory, generation_config = "auto", hf_overrides;
  std::vector<std::string> served_names, api_keys;
  std::string allowed_origins, allowed_methods = "*", allowed_headers = "*";
  bool allow_credentials = false, disable_log_requests = false, disable_log_stats = false;
  double log_stats_interval = 10;
  std::string log_level = "info";
  DeviceFlags dev;
  int port = 30000, http_threads = 2;
  parallel::Parallelism par;
  parallel::NodeOptions node_opts;
  runtime::EngineConfig engine_config;
  double shutdown_timeout = 30, read_timeout = 30;
  int64_t context_length = 0;
  app.add_option("--model", model_dir, "model folder (config.json, safetensors, tokenizer.json or tiktoken.model)")->required();
  app.add_option("--host", host, "address to listen on");
  app.add_option("--port", port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  add_device_flags(app, dev);
  add_hf_overrides_flag(app, hf_overrides);
  app.add_option("--max-running-requests", engine_config.max_running_requests, "requests in the running batch")
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-queued-requests", engine_config.max_queued_requests,
                 "requests waiting beyond the running batch; more are refused with 429")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--num-continuous-decode-steps", engine_config.num_continuous_decode_steps,
                 "decode steps run back to back before scheduling again")->check(CLI::Range(1, 64));
  app.add_option("--cuda-graph-max-bs", engine_config.cuda_graph_max_bs,
                 "GPU: decode steps of up to this many sequences replay CUDA graphs captured at startup "
                 "(capped by --max-running-requests)")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--disable-cuda-graph", engine_config.disable_cuda_graph,
               "GPU: run every decode step eagerly, without CUDA graphs");
  CLI::Option* chunked_prefill =
      app.add_option("--chunked-prefill-size", engine_config.chunked_prefill_size,
                     "prompt tokens per step at most (default: 512 on the CPU; on a GPU by its memory, as SGLang "
                     "chooses: 8192 on one of 60-160 GB)")
          ->check(CLI::Range(int64_t(16), int64_t(1) << 24));
  app.add_option("--mem-fraction-static", engine_config.mem_fraction_static,
                 "GPU: the fraction of its memory for the weights and the KV cache together")
      ->check(CLI::Range(0.01, 1.0));
  // The last --kv-memory given wins, so a wrapper's default can be overridden after it.
  app.add_option("--kv-memory", kv_memory,
                 "bytes for the KV cache (e.g. 256M, 2G; each rank's under --tp/--ep); default 256M on the CPU, "
                 "on a GPU what --mem-fraction-static leaves")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--context-length,--max-model-len", context_length,
                 "tokens per sequence, prompt and output (0: the model's maximum, shortened with a "
                 "warning to what the KV cache holds)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  app.add_option("--generation-config", generation_config,
                 "sampling defaults for requests that set none: auto (the model's generation_config.json), "
                 "vllm (none), or a folder holding a generation_config.json");
  app.add_option("--served-model-name", served_names,
                 "model names the API answers to; the first is the one responses carry (default: the folder name)");
  app.add_option("--api-key", api_keys, "keys one of which /v1/* requests must send as 'Authorization: Bearer KEY'")
      ->envname("TETRA_API_KEY");
  app.add_option("--allowed-origins", allowed_origins,
                 "CORS origins, a JSON list or comma list (\"*\": any); default none: no CORS");
  app.add_option("--allowed-methods", allowed_methods, "CORS methods, a JSON list or comma list (default *)");
  app.add_option("--allowed-headers", allowed_headers, "CORS request headers, a JSON list or comma list (default *)");
  app.add_flag("--allow-credentials", allow_credentials, "CORS: allow credentials");
  app.add_flag("--disable-log-requests", disable_log_requests, "no access line per request");
  app.add_flag("--disable-log-stats", disable_log_stats, "no periodic throughput line");
  app.add_option("--log-stats-interval", log_stats_interval, "seconds between throughput lines while busy")
      ->check(CLI::Range(0.05, 86400.0));
  app.add_option("--log-level", log_level, "debug, info, warning or error (warning: no access or throughput lines)")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
  add_parallel_flags(app, par);
  add_node_flags(app, node_opts);
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
  check_parallel_flags(par);
  parallel::check_node_options(node_opts, par.world());
  const std::filesystem::path dir(model_dir);
  TETRA_CHECK(std::filesystem::is_directory(dir), "model folder ", dir.string(), " does not exist");
  TETRA_CHECK(tok::has_tokenizer(dir), "tetra serve needs ", (dir / "tokenizer.json").string(),
              " (or tiktoken.model) to turn text into tokens");
  if (!kv_memory.empty()) engine_config.kv_memory_bytes = parse_bytes(kv_memory);
  engine_config.max_context = context_length;
  // Every flag is checked against the model's files before the server listens.
  const ModelConfig file_config = load_model_config(dir, hf_overrides);
  TETRA_CHECK(context_length <= file_config.max_position_embeddings, "--context-length ", context_length,
              " is more than the model's context of ", file_config.max_position_embeddings,
              " tokens (max_position_embeddings in config.json)");
  tok::Tokenizer tokenizer = tok::Tokenizer::load(dir);
  check_tokenizer_fits(tokenizer, file_config, dir);
  const server::SamplingDefaults defaults = sampling_defaults(generation_config, dir, file_config.vocab_size);
  if (const char* v = std::getenv("TETRA_TESTING_FAIL_STEP"); v && *v) {
    // Tests only (RELIABILITY cases 24 and 25): make that engine step fail like a device fault.
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    TETRA_CHECK(*end == '\0' && n >= 0, "TETRA_TESTING_FAIL_STEP must be a step number >= 0, not '", v, "'");
    engine_config.testing_fail_step = n;
    std::fprintf(stderr, "tetra serve: TETRA_TESTING_FAIL_STEP=%lld: step %lld will fail (testing)\n", n, n);
  }
  if (const char* v = std::getenv("TETRA_TESTING_FAIL_RANK"); v && *v) {
    // Tests only: that fault is thrown on this rank, inside the step, while the others wait.
    char* end = nullptr;
    const long long r = std::strtoll(v, &end, 10);
    TETRA_CHECK(*end == '\0' && r >= 0 && r < par.world(), "TETRA_TESTING_FAIL_RANK must be a rank in [0, ",
                par.world(), "), not '", v, "'");
    engine_config.testing_fail_rank = int(r);
  }
  set_log_level(log_level == "debug"     ? LogLevel::Debug
                : log_level == "info"    ? LogLevel::Info
                : log_level == "warning" ? LogLevel::Warn
                                         : LogLevel::Error);
  for (const auto& name : served_names) TETRA_CHECK(!name.empty(), "--served-model-name must not be empty");
  for (const auto& key : api_keys) TETRA_CHECK(!key.empty(), "--api-key must not be empty");
  if (served_names.empty()) {
    std::string name = std::filesystem::absolute(dir).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::absolute(dir).parent_path().filename().string();
    served_names.push_back(name);
  }
  server::CorsOptions cors{.allow_credentials = allow_credentials};
  if (!allowed_origins.empty()) cors.origins = server::parse_list_flag("--allowed-origins", allowed_origins);
  cors.methods = server::parse_list_flag("--allowed-methods", allowed_methods);
  cors.headers = server::parse_list_flag("--allowed-headers", allowed_headers);
  std::optional<server::TestingScript> testing_script;
  if (const char* v = std::getenv("TETRA_TESTING_SCRIPT"); v && *v) {
    // Tests only: scripted replies instead of the model's tokens (server/testing_script.h).
    testing_script = server::TestingScript::load(v);
    std::fprintf(stderr, "tetra serve: TETRA_TESTING_SCRIPT=%s: %zu scripted replies replace the model's (testing)\n",
                 v, testing_script->size());
  }
  raise_fd_limit();

  // The device answers (or the command ends with one sentence) before the server listens.
  const ops::BackendOptions backend_opts = backend_options(dev);
  // This node's first rank's.
  auto backend = ops::make_backend(runtime::rank_backend_options(backend_opts, par, {}, node_opts.nnodes)[0]);
  if (chunked_prefill->count() == 0) engine_config.chunked_prefill_size = runtime::default_chunked_prefill_size(*backend);
  std::fprintf(stderr, "tetra serve: backend %s%s; prompts in chunks of %lld tokens a step\n", backend->name().c_str(),
               par.world() > 1 ? str_cat(", ", par.world(), " ranks (--tp ", par.tp, " --ep ", par.ep, ")",
                                         node_opts.nnodes > 1 ? str_cat(" over ", node_opts.nnodes, " nodes") : "")
                                     .c_str()
                               : "",
               static_cast<long long>(engine_config.chunked_prefill_size));
  if (const int64_t available = host_memory_available_bytes();
      backend->memory_info().total_bytes == 0 && available > 0)
    TETRA_CHECK(engine_config.kv_memory_bytes * (par.world() / node_opts.nnodes) <= available,
                "--kv-memory asks for ", str_cat(gib(engine_config.kv_memory_bytes)), " GiB for the KV cache",
                par.world() > 1 ? str_cat(" of each of ", par.world() / node_opts.nnodes, " ranks") : "",
                ", but this machine has ", str_cat(gib(available)), " GiB of memory available");
  // Every node must start the same way: what must agree, for the nodes' join to check.
  const parallel::Fingerprint fingerprint = {
      {"tetra", version_string()},
      {"the model", describe_architecture(file_config)},
      {"--tp", std::to_string(par.tp)},
      {"--ep", std::to_string(par.ep)},
      {"--device", backend->device() == Device::Cuda ? "cuda" : "cpu"},
      {"--load-format", dev.load_format},
      {"--hf-overrides", hf_overrides},
      {"--kv-cache-dtype", dev.kv_cache_dtype},
      {"--moe-activation-dtype", dev.moe_activation_dtype},
      {"--kv-memory", std::to_string(engine_config.kv_memory_bytes)},
      {"--chunked-prefill-size", std::to_string(engine_config.chunked_prefill_size)},
      {"--max-running-requests", std::to_string(engine_config.max_running_requests)},
      {"--context-length", std::to_string(engine_config.max_context)},
      {"--cuda-graph-max-bs", std::to_string(engine_config.cuda_graph_max_bs)},
      {"--disable-cuda-graph", engine_config.disable_cuda_graph ? "on" : "off"},
  };
  if (node_opts.node_rank > 0) return serve_other_node(dir, node_opts, fingerprint, backend_opts, std::move(backend),
                                                       par, dev, hf_overrides, engine_config);

  server::Server srv(server::ServerOptions{.host = host,
                                           .port = port,
                                           .http_threads = http_threads,
                                           .shutdown_timeout_s = shutdown_timeout,
                                           .read_timeout_s = read_timeout,
                                           .api_keys = api_keys,
                                           .cors = cors,
                                           .log_requests = !disable_log_requests,
                                           .log_stats_interval_s = disable_log_stats ? 0.0 : log_stats_interval,
                                           .version = version_string()});
  srv.start();
  std::fprintf(stderr, "tetra serve: listening on http://%s:%d, loading %s\n", host.c_str(), srv.port(),
               dir.string().c_str());

  auto ranks = load_node_ranks(dir, node_opts, fingerprint, backend_opts, std::move(backend), par, dev, hf_overrides);
  const ModelConfig& mc = ranks->model().config();
  std::fprintf(stderr, "tetra serve: %s\n", describe_architecture(mc).c_str());
  runtime::Engine engine(*ranks, engine_config);
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
                 .model_names = served_names,
                 .max_context = max_context,
                 .vocab_size = mc.vocab_size,
                 .sampling_defaults = defaults,
                 .tool_format = tool_format,
                 .reasoning_format = reasoning_format,
                 .testing_script = testing_script ? &*testing_script : nullptr});
  const runtime::EngineStats stats = engine.stats();
  std::fprintf(stderr, "tetra serve: ready: %s, context %lld tokens, %lld KV blocks, http://%s:%d/v1\n",
               served_names.front().c_str(), static_cast<long long>(max_context),
               static_cast<long long>(stats.kv_blocks_total), host.c_str(), srv.port());

  const int rc = srv.wait();
  engine.stop();
  engine_thread.join();
  std::fprintf(stderr, "tetra serve: stopped\n");
  return rc;
}

}  // namespace tetra::cli
