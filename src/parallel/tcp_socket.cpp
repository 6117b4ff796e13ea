#include "parallel/tcp_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace tetra::parallel {
namespace {

using Clock = std::chrono::steady_clock;

std::string address_of(const sockaddr* a) {
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (a->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(a);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
    return str_cat(host, ":", port);
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(a);
  inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
  port = ntohs(v6->sin6_port);
  return str_cat("[", host, "]:", port);
}

void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

void resolve(const std::string& host, int port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
  TETRA_CHECK(rc == 0, "cannot resolve ", host, ": ", gai_strerror(rc));
}

}  // namespace

std::string HostPort::str() const {
  return host.find(':') != std::string::npos ? str_cat("[", host, "]:", port) : str_cat(host, ":", port);
}

HostPort parse_host_port(const std::string& s, const char* flag) {
  HostPort hp;
  std::string port;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    TETRA_CHECK(close != std::string::npos && close + 1 < s.size() && s[close + 1] == ':', flag,
                " takes HOST:PORT or [IPV6]:PORT, not '", s, "'");
    hp.host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    TETRA_CHECK(colon != std::string::npos && colon > 0 && s.find(':') == colon, flag,
                " takes HOST:PORT or [IPV6]:PORT, not '", s, "'");
    hp.host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  char* end = nullptr;
  const long p = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
  TETRA_CHECK(!port.empty() && *end == '\0' && p >= 1 && p <= 65535, flag, ": the port of '", s,
              "' must be a number in [1, 65535]");
  hp.port = int(p);
  return hp;
}

TcpSocket::~TcpSocket() {
  if (fd_ >= 0) ::close(fd_);
}

TcpSocket::TcpSocket(TcpSocket&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) { o.fd_ = -1; }

TcpSocket& TcpSocket::operator=(TcpSocket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = -1;
  }
  return *this;
}

std::string TcpSocket::peer_host() const {
  if (!peer_.empty() && peer_.front() == '[') return peer_.substr(1, peer_.find(']') - 1);
  return peer_.substr(0, peer_.rfind(':'));
}

void TcpSocket::send_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("the connection to ", peer_, " was lost (", k < 0 ? std::strerror(errno) : "closed", ")");
    p += k;
    n -= size_t(k);
  }
}

void TcpSocket::recv_all(void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd_, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("the connection to ", peer_, " was lost (", k < 0 ? std::strerror(errno) : "closed", ")");
    p += k;
    n -= size_t(k);
  }
}

void TcpSocket::send_frame(std::string_view bytes) {
  const uint32_t n = uint32_t(bytes.size());
  const unsigned char len[4] = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
  std::string frame(reinterpret_cast<const char*>(len), 4);
  frame.append(bytes);
  send_all(frame.data(), frame.size());
}

std::string TcpSocket::recv_frame(size_t max_bytes) {
  unsigned char len[4];
  recv_all(len, 4);
  const size_t n = size_t(len[0]) | size_t(len[1]) << 8 | size_t(len[2]) << 16 | size_t(len[3]) << 24;
  TETRA_CHECK(n <= max_bytes, "a message of ", n, " bytes from ", peer_, " is more than the ", max_bytes,
              " expected: is that a tetra node of the same version?");
  std::string bytes(n, '\0');
  recv_all(bytes.data(), n);
  return bytes;
}

void TcpSocket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void TcpSocket::set_receive_timeout(double seconds) {
  timeval tv{};
  tv.tv_sec = time_t(seconds);
  tv.tv_usec = suseconds_t((seconds - double(tv.tv_sec)) * 1e6);
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

TcpListener::TcpListener(const std::string& host, int port) {
  AddrInfo ai;
  resolve(host, port, true, &ai);
  std::string why = "no address";
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      port_ = bound.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                                         : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
      fd_ = fd;
      return;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  fail("cannot listen on ", HostPort{host, port}.str(), ": ", why);
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}

TcpSocket TcpListener::accept(double timeout_s, const char* waiting_for) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    TETRA_CHECK(left > 0, "no ", waiting_for, " connected to port ", port_, " within ", timeout_s, " s");
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, int(std::min<long long>(left, 1000)));
    if (rc <= 0) continue;
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_nodelay(fd);
    return TcpSocket(fd, address_of(reinterpret_cast<sockaddr*>(&from)));
  }
}

TcpSocket connect_tcp(const HostPort& to, double timeout_s, const char* waiting_for) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  std::string why;
  for (;;) {
    AddrInfo ai;
    resolve(to.host, to.port, false, &ai);
    for (addrinfo* a = ai.list; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        set_nodelay(fd);
        return TcpSocket(fd, address_of(a->ai_addr));
      }
      why = std::strerror(errno);
      ::close(fd);
    }
    TETRA_CHECK(Clock::now() < deadline, "cannot reach ", waiting_for, " at ", to.str(), " within ", timeout_s,
                " s (", why, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace tetra::parallel
