// Blocking TCP for the nodes of one server (--nnodes): the control link between them and the
// CPU ranks' collectives. POSIX sockets, IPv4 and IPv6, TCP_NODELAY; every failure is one
// sentence that names the peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tetra::parallel {

struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;
};

// "HOST:PORT" or "[V6]:PORT"; a bad one is one sentence naming `flag`.
HostPort parse_host_port(const std::string& s, const char* flag);

class TcpSocket {
 public:
  TcpSocket() = default;
  TcpSocket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~TcpSocket();
  TcpSocket(TcpSocket&& o) noexcept;
  TcpSocket& operator=(TcpSocket&& o) noexcept;
  TcpSocket(const TcpSocket&) = delete;
  TcpSocket& operator=(const TcpSocket&) = delete;

  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }  // "host:port" of the other end
  std::string peer_host() const;

  // The whole buffer, or a throw saying the connection to peer() was lost.
  void send_all(const void* data, size_t n);
  void recv_all(void* data, size_t n);
  // A frame: 4 bytes of little-endian length, then the bytes. recv_frame refuses a frame longer
  // than max_bytes (a peer that is not tetra, or a corrupt stream) before reading it.
  void send_frame(std::string_view bytes);
  std::string recv_frame(size_t max_bytes);
  // Ends both directions now: a recv blocked on another thread returns (and throws).
  void shutdown();
  // A recv that waits longer than this throws (0: waits for ever).
  void set_receive_timeout(double seconds);

 private:
  int fd_ = -1;
  std::string peer_;
};

class TcpListener {
 public:
  // Binds host:port (port 0: any free one) with SO_REUSEADDR and listens.
  TcpListener(const std::string& host, int port);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  int port() const { return port_; }
  // The next connection; throws once timeout_s passes with none.
  TcpSocket accept(double timeout_s, const char* waiting_for);

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Connects to `to`, retrying while nothing listens there yet (the other node may start later),
// until timeout_s; then one sentence naming the address and what was waited for.
TcpSocket connect_tcp(const HostPort& to, double timeout_s, const char* waiting_for);

}  // namespace tetra::parallel
