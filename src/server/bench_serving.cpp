// The workload and the report of `tetra bench serving`.
#include "server/bench_serving.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"

namespace tetra::server {
namespace {

using nlohmann::json;

struct Stats {
  double mean = 0, median = 0, p99 = 0;
};

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  // Linear interpolation between ranks, as numpy.percentile (SGLang's figures) does.
  auto pct = [&](double p) {
    const double rank = p / 100.0 * double(v.size() - 1);
    const size_t lo = size_t(std::floor(rank)), hi = size_t(std::ceil(rank));
    return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
  };
  s.median = pct(50);
  s.p99 = pct(99);
  return s;
}

// Plain words, about one token each, for servers that refuse token-id prompts.
const char* const kWords[] = {"time", "year", "people", "way", "day", "man", "thing", "woman", "life",
                              "child", "world", "school", "state", "family", "student", "group",
                              "country", "problem", "hand", "part", "place", "case", "week", "company"};

std::string text_prompt(std::mt19937_64& rng, int64_t words) {
  std::string s;
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  for (int64_t i = 0; i < words; ++i) {
    if (i) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

json request_body(const std::string& model, const json& prompt, int64_t max_tokens) {
  return {{"model", model},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0.0},
          {"ignore_eos", true},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}}};
}

}  // namespace

BenchReport run_bench_serving(const BenchOptions& o) {
  TETRA_CHECK(o.num_prompts >= 1 && o.num_prompts <= 10'000'000, "--num-prompts must be in [1, 1e7]");
  TETRA_CHECK(o.random_input_len >= 1 && o.random_input_len <= (1 << 24), "--random-input-len must be in [1, 2^24]");
  TETRA_CHECK(o.random_output_len >= 1 && o.random_output_len <= (1 << 24), "--random-output-len must be in [1, 2^24]");
  TETRA_CHECK(o.random_range_ratio >= 0 && o.random_range_ratio <= 1, "--random-range-ratio must be in [0, 1]");
  TETRA_CHECK(o.request_rate > 0, "--request-rate must be positive (inf: all at once)");
  TETRA_CHECK(o.prompt_format == "auto" || o.prompt_format == "ids" || o.prompt_format == "text",
              "--prompt-format must be ids, text or auto");
  BenchTarget target = parse_bench_url(o.url);
  target.api_key = o.api_key;

  BenchReport report;
  report.options = o;
  report.model = o.model;
  int64_t vocab = o.vocab_size;
  if (report.model.empty() || vocab <= 0) {
    json models = json::parse(bench_http_get(target, target.models_path), nullptr, false);
    TETRA_CHECK(models.is_object() && models.contains("data") && models["data"].is_array() && !models["data"].empty(),
                "GET ", target.models_path, " returned no models");
    const json& m = models["data"][0];
    if (report.model.empty()) report.model = m.value("id", std::string());
    if (vocab <= 0) vocab = m.contains("vocab_size") && m["vocab_size"].is_number_integer() ? m["vocab_size"].get<int64_t>() : 32000;
  }

  std::mt19937_64 rng(o.seed);
  auto draw_len = [&](int64_t len) {
    const int64_t lo = std::max<int64_t>(1, int64_t(double(len) * o.random_range_ratio));
    return std::uniform_int_distribution<int64_t>(lo, len)(rng);
  };
  std::vector<int64_t> in_lens(size_t(o.num_prompts)), out_lens(size_t(o.num_prompts));
  for (auto& l : in_lens) l = draw_len(o.random_input_len);
  for (auto& l : out_lens) l = draw_len(o.random_output_len);

  // Token ids unless the server refuses them (probed with one short request).
  report.prompt_format = o.prompt_format;
  if (report.prompt_format == "auto") {
    std::vector<std::string> probe = {request_body(report.model, json::array({1, 2, 3}), 1).dump()};
    auto r = bench_run_requests(target, probe, {0.0}, 1, 60, nullptr);
    report.prompt_format = r[0].ok ? "ids" : "text";
  }
  std::uniform_int_distribution<int64_t> token(0, std::max<int64_t>(1, vocab) - 1);
  std::vector<std::string> bodies;
  for (size_t i = 0; i < in_lens.size(); ++i) {
    json prompt;
    if (report.prompt_format == "ids") {
      prompt = json::array();
      for (int64_t k = 0; k < in_lens[i]; ++k) prompt.push_back(token(rng));
    } else {
      prompt = text_prompt(rng, in_lens[i]);
    }
    bodies.push_back(request_body(report.model, prompt, out_lens[i]).dump());
  }
  std::vector<double> start(bodies.size(), 0.0);
  if (std::isfinite(o.request_rate)) {
    std::exponential_distribution<double> gap(o.request_rate);
    double t = 0;
    for (double& s : start) {
      s = t;
      t += gap(rng);
    }
  }
  report.requests = bench_run_requests(target, bodies, start, o.max_concurrency, o.timeout_s, &report.duration_s);
  for (size_t i = 0; i < report.requests.size(); ++i)
    if (report.requests[i].ok && report.requests[i].prompt_tokens == 0) report.requests[i].prompt_tokens = in_lens[i];
  return report;
}

json BenchReport::summary() const {
  int64_t completed = 0, input = 0, output = 0;
  std::vector<double> ttft, itl, e2e;
  json errors = json::array();
  for (const auto& r : requests) {
    if (!r.ok) {
      if (errors.size() < 5) errors.push_back(r.error);
      continue;
    }
    ++completed;
    input += r.prompt_tokens;
    output += r.output_tokens;
    ttft.push_back(r.ttft_s * 1000);
    e2e.push_back(r.latency_s * 1000);
    for (double g : r.itl_s) itl.push_back(g * 1000);
  }
  const double d = duration_s > 0 ? duration_s : 1e-9;
  const Stats t = stats_of(ttft), i = stats_of(itl), e = stats_of(e2e);
  return {{"backend", "openai-completions"},
          {"dataset_name", "random"},
          {"model", model},
          {"prompt_format", prompt_format},
          {"num_prompts", requests.size()},
          {"random_input_len", options.random_input_len},
          {"random_output_len", options.random_output_len},
          {"random_range_ratio", options.random_range_ratio},
          {"max_concurrency", options.max_concurrency},
          {"request_rate", std::isfinite(options.request_rate) ? json(options.request_rate) : json("inf")},
          {"completed", completed},
          {"failed", int64_t(requests.size()) - completed},
          {"errors", errors},
          {"duration", duration_s},
          {"total_input_tokens", input},
          {"total_output_tokens", output},
          {"request_throughput", double(completed) / d},
          {"input_throughput", double(input) / d},
          {"output_throughput", double(output) / d},
          {"total_throughput", double(input + output) / d},
          {"mean_ttft_ms", t.mean}, {"median_ttft_ms", t.median}, {"p99_ttft_ms", t.p99},
          {"mean_itl_ms", i.mean}, {"median_itl_ms", i.median}, {"p99_itl_ms", i.p99},
          {"mean_e2e_latency_ms", e.mean}, {"median_e2e_latency_ms", e.median}, {"p99_e2e_latency_ms", e.p99}};
}

void print_bench_report(const BenchReport& report, FILE* out) {
  const json s = report.summary();
  auto line = [&](const char* name, double v, const char* fmt = "%.2f") {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    std::fprintf(out, "%-40s%12s\n", name, buf);
  };
  std::fprintf(out, "============ Serving Benchmark Result ============\n");
  std::fprintf(out, "%-40s%12s\n", "Prompt format:", report.prompt_format.c_str());
  line("Max request concurrency:", double(report.options.max_concurrency), "%.0f");
  line("Successful requests:", s["completed"].get<double>(), "%.0f");
  line("Failed requests:", s["failed"].get<double>(), "%.0f");
  line("Benchmark duration (s):", s["duration"].get<double>());
  line("Total input tokens:", s["total_input_tokens"].get<double>(), "%.0f");
  line("Total generated tokens:", s["total_output_tokens"].get<double>(), "%.0f");
  line("Request throughput (req/s):", s["request_throughput"].get<double>());
  line("Output token throughput (tok/s):", s["output_throughput"].get<double>());
  line("Total token throughput (tok/s):", s["total_throughput"].get<double>());
  std::fprintf(out, "---------------Time to First Token----------------\n");
  line("Mean TTFT (ms):", s["mean_ttft_ms"].get<double>());
  line("Median TTFT (ms):", s["median_ttft_ms"].get<double>());
  line("P99 TTFT (ms):", s["p99_ttft_ms"].get<double>());
  std::fprintf(out, "---------------Inter-Token Latency----------------\n");
  line("Mean ITL (ms):", s["mean_itl_ms"].get<double>());
  line("Median ITL (ms):", s["median_itl_ms"].get<double>());
  line("P99 ITL (ms):", s["p99_itl_ms"].get<double>());
  std::fprintf(out, "----------------End-to-End Latency----------------\n");
  line("Mean E2E Latency (ms):", s["mean_e2e_latency_ms"].get<double>());
  line("Median E2E Latency (ms):", s["median_e2e_latency_ms"].get<double>());
  std::fprintf(out, "==================================================\n");
  for (const auto& e : s["errors"]) std::fprintf(out, "error: %s\n", e.get<std::string>().c_str());
}

}  // namespace tetra::server
