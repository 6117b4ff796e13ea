// Prometheus metrics for /metrics: the engine's gauges and totals (read from EngineStats at
// scrape time) and the latencies the server observes per request.
#pragma once

#include <memory>
#include <string>

#include "runtime/engine.h"

namespace tetra::server {

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Thread-safe.
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_e2e(double seconds);
  void count_response(int status);
  void count_finished(const char* finish_reason);
  void count_disconnect();

  // The Prometheus text exposition; `stats` is null while the model loads.
  std::string render(const runtime::EngineStats* stats, int64_t http_connections);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tetra::server
