// The listener, the I/O threads and the drain: SIGTERM stops accepting requests (503), turns /health to 503,
// lets running requests finish up to --shutdown-timeout, then aborts what is left (their
// streams end with finish_reason "abort") and returns exit code 0. A second signal aborts at once.
// A failed engine step (a device fault on a GPU) starts the same drain and returns exit code 1,
// so a supervisor restarts the process. Signals and timers run on one strand.
#include "server/server.h"

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <thread>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/error.h"
#include "core/log.h"
#include "server/access_log.h"
#include "server/http_connection.h"

namespace tetra::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

struct Server::Impl {
  explicit Impl(ServerOptions o)
      : state(std::move(o)), ioc(std::max(1, state.options.http_threads)), control(net::make_strand(ioc)),
        acceptor(ioc), signals(control), drain_timer(control), poll_timer(control), fault_timer(control),
        stats_timer(control), accept_retry(ioc) {}

  ServerState state;
  net::io_context ioc;
  net::strand<net::io_context::executor_type> control;  // serializes the drain's handlers
  tcp::acceptor acceptor;
  net::signal_set signals;
  net::steady_timer drain_timer, poll_timer, fault_timer, stats_timer, accept_retry;
  bool ranks_failure_seen = false;  // watch_engine: the ranks' failure was seen one tick ago
  ThroughputSample last_sample;
  std::vector<std::thread> threads;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;

  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  bool draining = false;
  bool aborted = false;
  Clock::time_point aborted_at;
  int exit_code = 0;  // read by wait() after the I/O threads are joined
  Clock::time_point started = Clock::now();

  void do_accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors (EMFILE) and the like: back off instead of spinning.
        accept_retry.expires_after(std::chrono::milliseconds(50));
        accept_retry.async_wait([this](boost::system::error_code) { do_accept(); });
        return;
      }
      if (state.connections.load() >= state.options.max_connections) {
        boost::system::error_code ignored;
        socket.close(ignored);
      } else {
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);  // SSE events are small: send each at once
        start_connection(std::move(socket), state);
      }
      do_accept();
    });
  }

  void wait_signal() {
    signals.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      on_signal();
      wait_signal();
    });
  }

  void on_signal() {
    if (!state.has_context()) {
      // Still loading: nothing runs yet and the loader cannot be interrupted; leave now.
      std::fprintf(stderr, "tetra serve: stopped while loading\n");
      std::_Exit(0);
    }
    if (draining) {
      std::fprintf(stderr, "tetra serve: second signal, aborting running requests\n");
      abort_all();
      return;
    }
    begin_drain();
  }

  void begin_drain() {
    if (draining) return;
    draining = true;
    // The listener stays open so that new requests and health probes get a 503, not a refusal.
    state.phase.store(Phase::Draining);
    if (state.has_context()) state.context.engine->stop_accepting();
    const double timeout = state.options.shutdown_timeout_s;
    std::fprintf(stderr, "tetra serve: draining %lld request(s), up to %.0f s\n",
                 static_cast<long long>(state.active_generations.load()), timeout);
    if (timeout <= 0) {
      abort_all();
    } else {
      drain_timer.expires_after(std::chrono::milliseconds(int64_t(timeout * 1000)));
      drain_timer.async_wait([this](boost::system::error_code ec) {
        if (!ec) abort_all();
      });
    }
    poll();
  }

  // A forward that threw leaves the engine suspect (on a GPU, a sticky device fault): health
  // already says 503; stop taking requests, let the others finish, and exit non-zero.
  void watch_engine() {
    fault_timer.expires_after(std::chrono::milliseconds(100));
    fault_timer.async_wait([this](boost::system::error_code ec) {
      if (ec || draining) return;
      const runtime::EngineStats stats = state.context.engine->stats();
      // A rank's failure mid-step shows here before the step that fails with it: give that
      // step a tick to say so.
      const bool ranks_stopped = !stats.ranks_failure.empty() && std::exchange(ranks_failure_seen, true);
      if (stats.failed_steps > 0 || ranks_stopped) {
        if (stats.failed_steps > 0)
          std::fprintf(stderr, "tetra serve: the engine failed a step; draining, then exiting with status 1\n");
        else
          std::fprintf(stderr, "tetra serve: the model's ranks stopped (%s); draining, then exiting with status 1\n",
                       stats.ranks_failure.c_str());
        exit_code = 1;
        begin_drain();
        return;
      }
      watch_engine();
    });
  }

  void log_stats() {
    const double interval = state.options.log_stats_interval_s;
    stats_timer.expires_after(std::chrono::milliseconds(int64_t(interval * 1000)));
    stats_timer.async_wait([this](boost::system::error_code ec) {
      if (ec || draining) return;
      const runtime::EngineStats stats = state.context.engine->stats();
      const ThroughputSample now{.t_s = seconds_since(started), .prompt_tokens = stats.prompt_tokens,
                                 .generated_tokens = stats.generated_tokens};
      const std::string line = format_throughput_line(last_sample, now, stats);
      if (!line.empty() && log_level() <= LogLevel::Info) std::fprintf(stderr, "tetra serve: %s\n", line.c_str());
      last_sample = now;
      log_stats();
    });
  }

  void abort_all() {
    if (aborted) return;
    aborted = true;
    aborted_at = Clock::now();
    if (state.has_context()) state.context.engine->abort_all();
  }

  // Finished when no response is owed; after an abort, give the final events 3 s to flush.
  void poll() {
    const bool flushed = state.active_generations.load() == 0;
    if (flushed || (aborted && seconds_since(aborted_at) > 3.0)) {
      std::lock_guard lock(mutex);
      finished = true;
      cv.notify_all();
      return;
    }
    poll_timer.expires_after(std::chrono::milliseconds(20));
    poll_timer.async_wait([this](boost::system::error_code ec) {
      if (!ec) poll();
    });
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  const ServerOptions& o = impl_->state.options;
  TETRA_CHECK(o.port >= 0 && o.port <= 65535, "--port must be in [0, 65535], got ", o.port);
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
  TETRA_CHECK(!ec && !endpoints.empty(), "cannot resolve --host ", o.host, ": ", ec.message());
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  tcp::acceptor& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  TETRA_CHECK(!ec, "cannot listen on ", o.host, ":", o.port, ": ", ec.message());
}

Server::~Server() {
  if (!impl_->threads.empty()) {
    impl_->ioc.stop();
    for (auto& t : impl_->threads) t.join();
  }
}

int Server::port() const { return impl_->acceptor.local_endpoint().port(); }

void Server::start() {
  Impl& m = *impl_;
  m.work.emplace(m.ioc.get_executor());
  m.signals.add(SIGTERM);
  m.signals.add(SIGINT);
  m.wait_signal();
  m.do_accept();
  for (int i = 0; i < std::max(1, m.state.options.http_threads); ++i)
    m.threads.emplace_back([&m] { m.ioc.run(); });
}

void Server::set_ready(ServingContext context) {
  ServerState& s = impl_->state;
  s.context = std::move(context);
  s.context_set.store(true, std::memory_order_release);
  Phase expected = Phase::Loading;
  s.phase.compare_exchange_strong(expected, Phase::Ready);
  net::post(impl_->control, [m = impl_.get()] {
    m->watch_engine();
    if (m->state.options.log_stats_interval_s > 0) {
      const runtime::EngineStats stats = m->state.context.engine->stats();
      m->last_sample = {.t_s = seconds_since(m->started), .prompt_tokens = stats.prompt_tokens,
                        .generated_tokens = stats.generated_tokens};
      m->log_stats();
    }
  });
}

bool Server::stopping() const { return impl_->state.phase.load() == Phase::Draining; }

void Server::stop() {
  net::post(impl_->control, [m = impl_.get()] { m->begin_drain(); });
}

int Server::wait() {
  Impl& m = *impl_;
  {
    std::unique_lock lock(m.mutex);
    m.cv.wait(lock, [&] { return m.finished; });
  }
  m.work.reset();
  m.ioc.stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  return m.exit_code;
}

}  // namespace tetra::server
