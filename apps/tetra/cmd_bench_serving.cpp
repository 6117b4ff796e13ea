// tetra bench serving: SGLang bench_serving's random workload against an OpenAI-compatible URL.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "server/bench_serving.h"

namespace tetra::cli {

int cmd_bench_serving(int argc, char** argv) {
  CLI::App app{"Benchmark an OpenAI-compatible server with random prompts (SGLang's --dataset-name random).",
               "tetra bench serving"};
  app.option_defaults()->always_capture_default();
  server::BenchOptions o;
  std::string json_path, rate = "inf";
  app.add_option("--url", o.url, "server base URL (http://host:port) or its /v1/completions URL");
  app.add_option("--model", o.model, "model name (default: the first of /v1/models)");
  app.add_option("--num-prompts", o.num_prompts, "requests to send")->check(CLI::Range(1, 10'000'000));
  app.add_option("--random-input-len", o.random_input_len, "prompt tokens")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--random-output-len", o.random_output_len, "tokens to generate")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--random-range-ratio", o.random_range_ratio, "lengths drawn from [ratio * len, len]")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-concurrency", o.max_concurrency, "requests in flight at most (0: no cap)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--request-rate", rate, "requests per second, Poisson arrivals (inf: all at once)");
  app.add_option("--seed", o.seed, "seed of the prompts and arrivals");
  app.add_option("--prompt-format", o.prompt_format, "ids, text or auto (ids unless the server refuses them)")
      ->check(CLI::IsMember({"ids", "text", "auto"}));
  app.add_option("--vocab-size", o.vocab_size, "token ids are drawn below it (0: from /v1/models)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 31));
  app.add_option("--timeout", o.timeout_s, "seconds per request")->check(CLI::Range(1.0, 86400.0));
  app.add_option("--json", json_path, "also write the figures as one JSON object to FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // The key for a server started with --api-key, from where vLLM's and SGLang's benchmarks read it.
  if (const char* key = std::getenv("OPENAI_API_KEY"); key && *key) o.api_key = key;
  if (rate == "inf") {
    o.request_rate = std::numeric_limits<double>::infinity();
  } else {
    size_t used = 0;
    try {
      o.request_rate = std::stod(rate, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TETRA_CHECK(used == rate.size() && o.request_rate > 0 && std::isfinite(o.request_rate),
                "--request-rate must be a positive number or inf, got '", rate, "'");
  }
  const server::BenchReport report = server::run_bench_serving(o);
  server::print_bench_report(report, stdout);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    TETRA_CHECK(out.good(), "cannot write ", json_path);
    out << report.summary().dump(2) << "\n";
  }
  return 0;
}

}  // namespace tetra::cli
