// The connection's life: read one request (bounded in bytes and time) -> route -> write a
// whole response, or stream a Generation as chunked SSE while watching the socket so that a
// client who leaves aborts its engine requests at once -> next request (keep-alive) or close.
// Every handler runs on the connection's strand.
#include "server/http_connection.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/log.h"
#include "server/access_control.h"
#include "server/access_log.h"
#include "server/generation.h"
#include "server/router.h"

namespace tetra::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::chrono::milliseconds to_ms(double s) { return std::chrono::milliseconds(int64_t(s * 1000)); }

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerState& state) : stream_(std::move(socket)), state_(state) {
    state_.connections.fetch_add(1);
  }
  ~Connection() {
    if (gen_) gen_->client_gone();
    state_.connections.fetch_sub(1);
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

 private:
  void do_read() {
    if (closed_) return;
    cors_headers_.clear();  // a 413 or 431 for the next request must not carry this one's
    parser_.emplace();
    parser_->header_limit(uint32_t(state_.options.max_header_bytes));
    parser_->body_limit(state_.options.max_body_bytes);
    // One deadline for the whole request: a client dribbling bytes (slowloris) is cut off.
    stream_.expires_after(to_ms(state_.options.read_timeout_s));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit) {
      return reply_and_close({.status = 431, .message = "request headers are larger than " +
                                                        std::to_string(state_.options.max_header_bytes) + " bytes"});
    }
    if (ec == http::error::body_limit) {
      return reply_and_close({.status = 413, .message = "request body is larger than " +
                                                        std::to_string(state_.options.max_body_bytes) + " bytes",
                              .code = "request_too_large"});
    }
    if (ec && ec.category() == beast::error_code(http::error::end_of_stream).category() && ec != http::error::end_of_stream &&
        ec != http::error::partial_message) {
      return reply_and_close({.status = 400, .message = std::string("malformed HTTP request: ") + ec.message()});
    }
    if (ec) return close();  // the client left, or the read deadline passed

    stream_.expires_never();
    auto& msg = parser_->get();
    keep_alive_ = msg.keep_alive();
    HttpRequest req{.method = std::string(msg.method_string()),
                    .target = std::string(msg.target()),
                    .content_type = std::string(msg[http::field::content_type]),
                    .authorization = std::string(msg[http::field::authorization]),
                    .origin = std::string(msg[http::field::origin]),
                    .access_control_request_method = std::string(msg[http::field::access_control_request_method]),
                    .access_control_request_headers = std::string(msg[http::field::access_control_request_headers]),
                    .body = std::move(msg.body()),
                    .arrival = Clock::now()};
    cors_headers_ = req.method == "OPTIONS" ? HeaderList{} : cors_response_headers(state_.options.cors, req.origin);
    const std::string path = req.target.substr(0, req.target.find('?'));
    logged_ = {.method = req.method, .path = path, .arrival = req.arrival,
               .enabled = state_.options.log_requests && path != "/health" && path != "/metrics"};
    RouteResult r = route(state_, req);
    if (r.generation) return start_generation(std::move(r.generation));
    write_response(std::move(r.response));
  }

  void reply_and_close(const ApiError& e) {
    keep_alive_ = false;
    HttpResponse r = error_response(e);
    r.close = true;
    write_response(std::move(r));
  }

  void write_response(HttpResponse r) {
    auto res = std::make_shared<http::response<http::string_body>>(http::status(r.status), 11);
    res->set(http::field::server, "tetra");
    res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res->set(k, v);
    for (auto& [k, v] : cors_headers_) res->set(k, v);
    const bool keep = keep_alive_ && !r.close && state_.phase.load() != Phase::Draining;
    res->keep_alive(keep);
    res->body() = std::move(r.body);
    res->prepare_payload();
    state_.metrics.count_response(r.status);
    stream_.expires_after(to_ms(state_.options.write_timeout_s));
    const bool linger = r.close;
    const int status = r.status;
    writing_ = true;
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep, linger, status](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->log_access(status);
      if (!ec && linger) return self->linger_close();
      if (ec || !keep) return self->close();
      self->after_response();
    });
  }

  // After an error sent mid-request (413, 431), closing at once would reset the connection
  // while the client is still sending, and the reset can destroy the answer before the client
  // reads it. So: stop sending, discard what still arrives for at most a second, then close.
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(1));
    discard();
  }

  void discard() {
    stream_.async_read_some(net::buffer(discard_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->discard();
    });
  }

  // --- streaming a generation ---

  void start_generation(std::shared_ptr<Generation> g) {
    gen_ = std::move(g);
    hold_ = shared_from_this();  // alive until the generation ends, whatever the socket does
    auto ex = stream_.get_executor();
    gen_->attach([ex](std::function<void()> f) { net::post(ex, std::move(f)); },
                 [weak = weak_from_this()] {
                   if (auto self = weak.lock()) self->pump();
                 });
    watch_disconnect();
    pump();
  }

  void pump() {
    if (!gen_ || writing_ || closed_) return;
    std::string data;
    const bool done = gen_->take(data);
    if (!gen_->streaming()) {
      if (!done) return;
      const int status = gen_->status();
      end_generation();
      return write_response({.status = status, .body = std::move(data)});
    }
    std::string frame;
    if (!head_sent_) {
      head_sent_ = true;
      state_.metrics.count_response(200);
      frame = "HTTP/1.1 200 OK\r\nServer: tetra\r\nContent-Type: text/event-stream\r\n"
              "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
      for (auto& [k, v] : cors_headers_) frame += k + ": " + v + "\r\n";
      frame += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    }
    if (!data.empty()) {
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      frame += size;
      frame += data;
      frame += "\r\n";
    }
    if (done) frame += "0\r\n\r\n";
    if (frame.empty()) return;
    writing_ = true;
    out_ = std::move(frame);
    stream_.expires_after(to_ms(state_.options.write_timeout_s));
    net::async_write(stream_, net::buffer(out_), [self = shared_from_this(), done](beast::error_code ec, size_t) {
      self->writing_ = false;
      // The watch may have seen the client leave while this write was in flight.
      if (ec || !self->gen_) return self->client_left();
      if (!done) return self->pump();
      self->end_generation();
      self->log_access(200);
      if (!self->keep_alive_ || self->state_.phase.load() == Phase::Draining) return self->close();
      self->after_response();
    });
  }

  // While a response is pending the socket is not read, so wait for readability instead: EOF
  // or an error means the client left; bytes mean a pipelined request, read after this one.
  void watch_disconnect() {
    watching_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      self->watching_ = false;
      if (!self->gen_) {
        // The generation ended. If its response is still being written, the write's handler
        // reads next; starting a read here too would put two reads on the stream.
        if (!self->closed_ && !self->writing_) self->do_read();
        return;
      }
      if (ec) return self->client_left();
      char byte;
      beast::error_code peek_ec;
      auto& sock = self->stream_.socket();
      sock.non_blocking(true, peek_ec);
      const size_t n = sock.receive(net::buffer(&byte, 1), tcp::socket::message_peek, peek_ec);
      sock.non_blocking(false, ec);
      if (peek_ec == net::error::would_block) return self->watch_disconnect();
      if (peek_ec || n == 0) return self->client_left();
    });
  }

  void client_left() {
    if (gen_) {
      gen_->client_gone();
      summary_ = gen_->summary();
      gen_.reset();
      log_access(head_sent_ ? 200 : 499);  // 499: the client left before any answer (nginx's code)
    }
    hold_.reset();
    close();
  }

  void end_generation() {
    if (!gen_) return;
    summary_ = gen_->summary();
    gen_->release();
    gen_.reset();
    head_sent_ = false;
    hold_.reset();
  }

  void after_response() {
    if (closed_) return;
    if (watching_) {
      beast::error_code ec;
      stream_.socket().cancel(ec);  // the watch handler then starts the next read
      return;
    }
    do_read();
  }

  // Once per request, after its last byte was handed to the socket (or the client left).
  void log_access(int status) {
    if (!logged_.enabled || log_level() > LogLevel::Info) {
      summary_.reset();
      return;
    }
    logged_.enabled = false;
    AccessRecord r{.method = logged_.method, .path = logged_.path, .status = status,
                   .total_s = seconds_since(logged_.arrival)};
    if (summary_) {
      r.request_id = summary_->id;
      r.prompt_tokens = summary_->prompt_tokens;
      r.generated_tokens = summary_->generated_tokens;
      r.ttft_s = summary_->ttft_s;
      r.finish = summary_->finish;
      summary_.reset();
    }
    std::fprintf(stderr, "tetra serve: %s\n", format_access_line(r).c_str());
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  ServerState& state_;
  std::shared_ptr<Generation> gen_;
  std::shared_ptr<Connection> hold_;
  std::string out_;
  HeaderList cors_headers_;  // of the request being answered
  struct {
    std::string method, path;
    Clock::time_point arrival;
    bool enabled = false;  // set per request; cleared once its line is written
  } logged_;
  std::optional<Generation::Summary> summary_;
  char discard_buf_[4096];
  bool keep_alive_ = true;
  bool head_sent_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool closed_ = false;
};

}  // namespace

void start_connection(tcp::socket socket, ServerState& state) {
  std::make_shared<Connection>(std::move(socket), state)->start();
}

}  // namespace tetra::server
