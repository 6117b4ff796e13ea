// State shared by the connections, the router and the generations of one server.
// Internal to src/server; free of Asio so that it is cheap to include.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "server/metrics.h"
#include "server/server.h"

namespace tetra::server {

enum class Phase : int { Loading, Ready, Draining };

struct ServerState {
  explicit ServerState(ServerOptions o) : options(std::move(o)) {}

  ServerOptions options;
  Metrics metrics;
  std::atomic<Phase> phase{Phase::Loading};
  std::atomic<int64_t> active_generations{0};  // responses not yet complete
  std::atomic<int64_t> connections{0};
  std::atomic<uint64_t> next_id{1};

  // Written once by set_ready before context_set is released; read only after acquiring it.
  ServingContext context;
  std::atomic<bool> context_set{false};
  bool ready() const { return phase.load(std::memory_order_acquire) == Phase::Ready; }
  bool has_context() const { return context_set.load(std::memory_order_acquire); }
};

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace tetra::server
