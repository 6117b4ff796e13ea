// The benchmark's HTTP client: one io_context thread drives every request (thousands of
// concurrent streams cost sockets, not threads), and each chunk is timed on arrival.
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/error.h"
#include "server/bench_serving.h"

namespace tetra::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using BenchClock = std::chrono::steady_clock;

double since(BenchClock::time_point t) { return std::chrono::duration<double>(BenchClock::now() - t).count(); }

struct Runner;

class StreamRequest : public std::enable_shared_from_this<StreamRequest> {
 public:
  StreamRequest(Runner& runner, size_t index);
  void start();

 private:
  void fail(const std::string& why);
  void read_body();
  void on_data(const char* data, size_t n);
  void on_event(const std::string& data);
  void done();

  Runner& runner_;
  size_t index_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char chunk_[16384];
  std::string pending_;  // SSE text not yet split into events
  BenchClock::time_point sent_, last_;
  bool got_first_ = false, got_done_ = false, finished_ = false;
  BenchRequestResult result_;
};

struct Runner {
  net::io_context ioc{1};
  const BenchTarget& target;
  const std::vector<std::string>& bodies;
  const std::vector<double>& start_s;
  int max_concurrency;
  double timeout_s;
  tcp::resolver::results_type endpoints;
  std::vector<BenchRequestResult> results;
  size_t next = 0, finished = 0;
  int in_flight = 0;
  BenchClock::time_point t0;
  net::steady_timer timer{ioc};

  Runner(const BenchTarget& t, const std::vector<std::string>& b, const std::vector<double>& s, int c, double to)
      : target(t), bodies(b), start_s(s), max_concurrency(c), timeout_s(to), results(b.size()) {}

  // Starts every request whose time has come while the cap allows; re-arms for the next one.
  void launch() {
    while (next < bodies.size() && (max_concurrency <= 0 || in_flight < max_concurrency)) {
      const double wait = start_s[next] - since(t0);
      if (wait > 0) {
        timer.expires_after(std::chrono::microseconds(int64_t(wait * 1e6)));
        timer.async_wait([this](beast::error_code ec) {
          if (!ec) launch();
        });
        return;
      }
      ++in_flight;
      std::make_shared<StreamRequest>(*this, next++)->start();
    }
  }
  void finish(size_t index, BenchRequestResult r) {
    results[index] = std::move(r);
    --in_flight;
    ++finished;
    launch();
  }
};

StreamRequest::StreamRequest(Runner& runner, size_t index)
    : runner_(runner), index_(index), stream_(net::make_strand(runner.ioc)) {
  req_ = {http::verb::post, runner.target.completions_path, 11};
  req_.set(http::field::host, runner.target.host);
  req_.set(http::field::content_type, "application/json");
  req_.set(http::field::accept, "text/event-stream");
  if (!runner.target.api_key.empty()) req_.set(http::field::authorization, "Bearer " + runner.target.api_key);
  req_.keep_alive(false);
  req_.body() = runner.bodies[index];
  req_.prepare_payload();
}

void StreamRequest::start() {
  sent_ = BenchClock::now();
  stream_.expires_after(std::chrono::milliseconds(int64_t(runner_.timeout_s * 1000)));
  stream_.async_connect(runner_.endpoints, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
    if (ec) return self->fail("connect: " + ec.message());
    beast::error_code ignored;
    self->stream_.socket().set_option(tcp::no_delay(true), ignored);
    http::async_write(self->stream_, self->req_, [self](beast::error_code ec, size_t) {
      if (ec) return self->fail("write: " + ec.message());
      self->parser_.emplace();
      self->parser_->body_limit(boost::none);
      http::async_read_header(self->stream_, self->buffer_, *self->parser_, [self](beast::error_code ec, size_t) {
        if (ec) return self->fail("read: " + ec.message());
        const int status = self->parser_->get().result_int();
        if (status != 200) self->result_.error = "HTTP " + std::to_string(status);
        self->read_body();
      });
    });
  });
}

void StreamRequest::read_body() {
  if (parser_->is_done()) return done();
  auto& body = parser_->get().body();
  body.data = chunk_;
  body.size = sizeof chunk_;
  // read_some, not read: a whole read would wait for the buffer to fill and hide chunk timing.
  http::async_read_some(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
    auto& b = self->parser_->get().body();
    const size_t n = sizeof self->chunk_ - b.size;
    if (n) self->on_data(self->chunk_, n);
    if (ec == http::error::need_buffer) ec = {};
    if (ec == http::error::end_of_stream) return self->done();
    if (ec) return self->fail("read: " + ec.message());
    self->read_body();
  });
}

void StreamRequest::on_data(const char* data, size_t n) {
  if (!result_.error.empty()) {  // an error status: keep its body for the message
    if (result_.error.size() < 300) result_.error.append(data, std::min<size_t>(n, 300));
    return;
  }
  pending_.append(data, n);
  size_t pos;
  while ((pos = pending_.find("\n\n")) != std::string::npos) {
    std::string event = pending_.substr(0, pos);
    pending_.erase(0, pos + 2);
    if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
  }
}

void StreamRequest::on_event(const std::string& data) {
  if (data == "[DONE]") {
    got_done_ = true;
    return;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded()) return;
  if (j.contains("error")) {
    result_.error = "stream error: " + j["error"].value("message", std::string("?"));
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    result_.prompt_tokens = j["usage"].value("prompt_tokens", int64_t(0));
    result_.output_tokens = j["usage"].value("completion_tokens", int64_t(0));
  }
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
  const auto& c = j["choices"][0];
  std::string text;
  if (c.contains("text") && c["text"].is_string()) text = c["text"];
  else if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string())
    text = c["delta"]["content"];
  if (text.empty()) return;
  const auto now = BenchClock::now();
  if (!got_first_) {
    got_first_ = true;
    result_.ttft_s = std::chrono::duration<double>(now - sent_).count();
  } else {
    result_.itl_s.push_back(std::chrono::duration<double>(now - last_).count());
  }
  last_ = now;
}

void StreamRequest::fail(const std::string& why) {
  if (result_.error.empty()) result_.error = why;
  result_.ok = false;
  done();
}

void StreamRequest::done() {
  if (finished_) return;
  finished_ = true;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
  result_.latency_s = since(sent_);
  if (result_.error.empty() && !got_done_) result_.error = "stream ended without data: [DONE]";
  result_.ok = result_.error.empty();
  if (result_.ok && result_.output_tokens == 0) result_.output_tokens = int64_t(result_.itl_s.size()) + (got_first_ ? 1 : 0);
  runner_.finish(index_, std::move(result_));
}

}  // namespace

BenchTarget parse_bench_url(const std::string& url) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  else TETRA_CHECK(rest.find("://") == std::string::npos, "--url must be an http:// URL, got '", url, "'");
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  BenchTarget t;
  const size_t colon = hostport.rfind(':');
  t.host = hostport.substr(0, colon);
  t.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  TETRA_CHECK(!t.host.empty() && !t.port.empty(), "--url has no host, got '", url, "'");
  const std::string suffix = "/completions";
  if (path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    t.completions_path = path;
    t.models_path = path.substr(0, path.rfind('/')) + "/models";
  } else {
    if (path.size() < 3 || path.compare(path.size() - 3, 3, "/v1") != 0) path += "/v1";
    t.completions_path = path + "/completions";
    t.models_path = path + "/models";
  }
  return t;
}

std::string bench_http_get(const BenchTarget& target, const std::string& path) {
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(target.host, target.port, ec);
  TETRA_CHECK(!ec, "cannot resolve ", target.host, ": ", ec.message());
  stream.expires_after(std::chrono::seconds(30));
  stream.connect(endpoints, ec);
  TETRA_CHECK(!ec, "cannot connect to ", target.host, ":", target.port, ": ", ec.message());
  http::request<http::empty_body> req{http::verb::get, path, 11};
  req.set(http::field::host, target.host);
  if (!target.api_key.empty()) req.set(http::field::authorization, "Bearer " + target.api_key);
  http::write(stream, req, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  if (!ec) http::read(stream, buffer, res, ec);
  TETRA_CHECK(!ec, "GET ", path, " failed: ", ec.message());
  TETRA_CHECK(res.result_int() == 200, "GET ", path, " answered HTTP ", res.result_int());
  return res.body();
}

std::vector<BenchRequestResult> bench_run_requests(const BenchTarget& target, const std::vector<std::string>& bodies,
                                                   const std::vector<double>& start_s, int max_concurrency,
                                                   double timeout_s, double* duration_s) {
  Runner runner(target, bodies, start_s, max_concurrency, timeout_s);
  tcp::resolver resolver(runner.ioc);
  beast::error_code ec;
  runner.endpoints = resolver.resolve(target.host, target.port, ec);
  TETRA_CHECK(!ec, "cannot resolve ", target.host, ": ", ec.message());
  runner.t0 = BenchClock::now();
  runner.launch();
  runner.ioc.run();
  if (duration_s) *duration_s = since(runner.t0);
  return std::move(runner.results);
}

}  // namespace tetra::server
