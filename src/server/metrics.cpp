#include "server/metrics.h"

#include <mutex>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace tetra::server {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

struct Metrics::Impl {
  prometheus::Registry registry;
  std::mutex mutex;  // serializes render(): totals are carried over as deltas

  prometheus::Gauge& running = BuildGauge().Name("tetra_num_requests_running")
      .Help("Requests in the running batch").Register(registry).Add({});
  prometheus::Gauge& connections = BuildGauge().Name("tetra_http_connections")
      .Help("Open HTTP connections").Register(registry).Add({});
  prometheus::Gauge& waiting = BuildGauge().Name("tetra_num_requests_waiting")
      .Help("Requests waiting in the queue").Register(registry).Add({});
  prometheus::Family<prometheus::Gauge>& kv = BuildGauge().Name("tetra_kv_blocks")
      .Help("KV cache blocks by state").Register(registry);
  prometheus::Gauge& kv_used = kv.Add({{"state", "used"}});
  prometheus::Gauge& kv_free = kv.Add({{"state", "free"}});
  prometheus::Gauge& kv_total = kv.Add({{"state", "total"}});
  prometheus::Gauge& kv_cached = kv.Add({{"state", "cached"}});  // holding a reusable prefix
  prometheus::Gauge& kv_usage = BuildGauge().Name("tetra_kv_cache_usage_ratio")
      .Help("Fraction of KV blocks in use").Register(registry).Add({});

  prometheus::Counter& prefix_hit = BuildCounter().Name("tetra_prefix_cache_hit_tokens_total")
      .Help("Prompt tokens served from the prefix cache").Register(registry).Add({});
  prometheus::Counter& prefix_queried = BuildCounter().Name("tetra_prefix_cache_queried_tokens_total")
      .Help("Prompt tokens looked up in the prefix cache").Register(registry).Add({});
  prometheus::Counter& preemptions = BuildCounter().Name("tetra_preemptions_total")
      .Help("Requests preempted (KV blocks freed, recomputed later)").Register(registry).Add({});
  prometheus::Counter& prompt_tokens = BuildCounter().Name("tetra_prompt_tokens_total")
      .Help("Prompt tokens prefilled").Register(registry).Add({});
  prometheus::Counter& generated_tokens = BuildCounter().Name("tetra_generation_tokens_total")
      .Help("Tokens generated").Register(registry).Add({});
  prometheus::Counter& steps = BuildCounter().Name("tetra_engine_steps_total")
      .Help("Engine steps run").Register(registry).Add({});
  prometheus::Counter& failed_steps = BuildCounter().Name("tetra_engine_failed_steps_total")
      .Help("Engine forwards that threw; their requests ended with an error").Register(registry).Add({});

  prometheus::Family<prometheus::Counter>& responses = BuildCounter().Name("tetra_http_responses_total")
      .Help("HTTP responses by status code").Register(registry);
  prometheus::Family<prometheus::Counter>& finished = BuildCounter().Name("tetra_requests_finished_total")
      .Help("Engine requests finished, by finish reason").Register(registry);
  prometheus::Counter& disconnects = BuildCounter().Name("tetra_client_disconnects_total")
      .Help("Requests aborted because the client went away").Register(registry).Add({});

  // Buckets span a tiny CPU model (sub-millisecond steps) to a loaded GPU server (seconds).
  prometheus::Histogram& ttft = BuildHistogram().Name("tetra_time_to_first_token_seconds")
      .Help("Time from request arrival to its first generated token").Register(registry)
      .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                        0.5, 1, 2.5, 5, 10, 30, 60});
  prometheus::Histogram& itl = BuildHistogram().Name("tetra_inter_token_latency_seconds")
      .Help("Time between consecutive generated tokens of a request").Register(registry)
      .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                        0.05, 0.1, 0.25, 0.5, 1, 2.5});
  prometheus::Histogram& e2e = BuildHistogram().Name("tetra_e2e_request_latency_seconds")
      .Help("Time from request arrival to its last token").Register(registry)
      .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                                        30, 60, 120, 300});

  runtime::EngineStats last;  // totals already added to the counters

  void add_delta(prometheus::Counter& c, int64_t now, int64_t& seen) {
    if (now > seen) c.Increment(double(now - seen));
    seen = std::max(seen, now);
  }
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}
Metrics::~Metrics() = default;

void Metrics::observe_ttft(double s) { impl_->ttft.Observe(s); }
void Metrics::observe_inter_token(double s) { impl_->itl.Observe(s); }
void Metrics::observe_e2e(double s) { impl_->e2e.Observe(s); }
void Metrics::count_response(int status) {
  impl_->responses.Add({{"code", std::to_string(status)}}).Increment();
}
void Metrics::count_finished(const char* reason) { impl_->finished.Add({{"reason", reason}}).Increment(); }
void Metrics::count_disconnect() { impl_->disconnects.Increment(); }

std::string Metrics::render(const runtime::EngineStats* s, int64_t http_connections) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  m.connections.Set(double(http_connections));
  if (s) {
    m.running.Set(double(s->running));
    m.waiting.Set(double(s->waiting));
    m.kv_used.Set(double(s->kv_blocks_used));
    m.kv_free.Set(double(s->kv_blocks_free));
    m.kv_total.Set(double(s->kv_blocks_total));
    m.kv_cached.Set(double(s->kv_blocks_cached));
    m.kv_usage.Set(s->kv_blocks_total ? double(s->kv_blocks_used) / double(s->kv_blocks_total) : 0.0);
    m.add_delta(m.prefix_hit, s->prefix_cache_hit_tokens, m.last.prefix_cache_hit_tokens);
    m.add_delta(m.prefix_queried, s->prefix_cache_queried_tokens, m.last.prefix_cache_queried_tokens);
    m.add_delta(m.preemptions, s->preemptions, m.last.preemptions);
    m.add_delta(m.prompt_tokens, s->prompt_tokens, m.last.prompt_tokens);
    m.add_delta(m.generated_tokens, s->generated_tokens, m.last.generated_tokens);
    m.add_delta(m.steps, s->steps, m.last.steps);
    m.add_delta(m.failed_steps, s->failed_steps, m.last.failed_steps);
  }
  return prometheus::TextSerializer().Serialize(m.registry.Collect());
}

}  // namespace tetra::server
