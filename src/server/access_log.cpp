#include "server/access_log.h"

#include <cstdio>

namespace tetra::server {
namespace {

std::string printable(const std::string& s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  if (s.size() > max_bytes) out += "...";
  return out;
}

}  // namespace

std::string format_access_line(const AccessRecord& r) {
  std::string line = "request " + (r.request_id.empty() ? std::string("-") : r.request_id) + " " +
                     printable(r.method, 16) + " " + printable(r.path, 256) + " " + std::to_string(r.status);
  char buf[64];
  if (r.prompt_tokens >= 0) {
    line += " prompt_tokens=" + std::to_string(r.prompt_tokens) +
            " generated_tokens=" + std::to_string(r.generated_tokens);
    if (r.ttft_s >= 0) {
      std::snprintf(buf, sizeof buf, " ttft=%.3fs", r.ttft_s);
      line += buf;
    } else {
      line += " ttft=-";
    }
  }
  std::snprintf(buf, sizeof buf, " total=%.3fs", r.total_s);
  line += buf;
  if (!r.finish.empty()) line += " finish=" + r.finish;
  return line;
}

std::string format_throughput_line(const ThroughputSample& before, const ThroughputSample& now,
                                   const runtime::EngineStats& stats) {
  const int64_t prompt = now.prompt_tokens - before.prompt_tokens;
  const int64_t generated = now.generated_tokens - before.generated_tokens;
  if (prompt == 0 && generated == 0 && stats.running == 0 && stats.waiting == 0) return "";
  const double dt = now.t_s - before.t_s > 0 ? now.t_s - before.t_s : 1.0;
  const double kv = stats.kv_blocks_total > 0 ? 100.0 * double(stats.kv_blocks_used) / double(stats.kv_blocks_total) : 0;
  const double hits = stats.prefix_cache_queried_tokens > 0
                          ? 100.0 * double(stats.prefix_cache_hit_tokens) / double(stats.prefix_cache_queried_tokens)
                          : 0;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "throughput: prompt %.1f tok/s, generation %.1f tok/s, running %lld, waiting %lld, "
                "KV cache %.1f%% used, prefix cache hits %.1f%%",
                double(prompt) / dt, double(generated) / dt, static_cast<long long>(stats.running),
                static_cast<long long>(stats.waiting), kv, hits);
  return buf;
}

}  // namespace tetra::server
