// `tetra bench serving`: SGLang bench_serving's `--dataset-name random` workload against any
// OpenAI-compatible server. Prompts of random token ids (or random words where the server
// takes no token ids), streamed completions, Poisson arrivals, a concurrency cap; it reports
// throughput and TTFT / inter-token latency, and never judges.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra::server {

struct BenchOptions {
  std::string url = "http://127.0.0.1:30000";  // base URL, or the full /v1/completions URL
  std::string model;                            // empty: the first of GET /v1/models
  int num_prompts = 1000;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 1024;
  double random_range_ratio = 0.0;  // lengths drawn from [ratio * len, len], as SGLang
  int max_concurrency = 0;          // 0: no cap
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s, Poisson
  uint64_t seed = 1;
  std::string prompt_format = "auto";  // ids | text | auto (ids unless the server refuses them)
  int64_t vocab_size = 0;              // 0: from /v1/models, else 32000
  double timeout_s = 3600;             // per request
  std::string api_key;                 // sent as "Authorization: Bearer KEY" when set
};

// One request as the client saw it.
struct BenchRequestResult {
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double ttft_s = 0;
  double latency_s = 0;
  std::vector<double> itl_s;  // gaps between consecutive content chunks
};

struct BenchReport {
  BenchOptions options;
  std::string model, prompt_format;
  double duration_s = 0;
  std::vector<BenchRequestResult> requests;
  nlohmann::json summary() const;  // the figures printed and written to --json
};

BenchReport run_bench_serving(const BenchOptions& options);
void print_bench_report(const BenchReport& report, FILE* out);

// The transport (bench_client.cpp): one streamed POST, timed.
struct BenchTarget {
  std::string host, port, models_path, completions_path;
  std::string api_key;  // empty: no Authorization header
};
BenchTarget parse_bench_url(const std::string& url);
// A plain GET; returns the body of a 200 response or throws tetra::Error.
std::string bench_http_get(const BenchTarget& target, const std::string& path);
// Sends every body (body i not before start_s[i] seconds after the start, at most
// `max_concurrency` in flight) as a streaming completion; results in the same order.
std::vector<BenchRequestResult> bench_run_requests(const BenchTarget& target,
                                                   const std::vector<std::string>& bodies,
                                                   const std::vector<double>& start_s,
                                                   int max_concurrency, double timeout_s,
                                                   double* duration_s);

}  // namespace tetra::server
