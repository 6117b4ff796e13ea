#include "parallel/tcp_communicator.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/host_sum.h"

namespace tetra::parallel {
namespace {

// What this node's communicators share: the abort, which ends every rank's collective here.
struct AbortState {
  std::mutex mu;
  std::string reason;
  std::vector<TcpSocket*> sockets;  // every communicator's, shut down on abort

  std::string why() {
    std::lock_guard<std::mutex> lock(mu);
    return reason;
  }
};

// A collective's header: what every rank must agree on before any payload is read.
struct Header {
  uint32_t op = 0, dtype = 0;
  uint64_t bytes = 0;
  bool operator==(const Header&) const = default;
};

class TcpCommunicator : public ops::Communicator {
 public:
  TcpCommunicator(int rank, int size, std::vector<TcpSocket> peers, std::shared_ptr<AbortState> abort)
      : rank_(rank), size_(size), peers_(std::move(peers)), abort_(std::move(abort)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const ops::Context&, TensorView x) override {
    TETRA_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "all_reduce_sum: ", dtype_name(x.dtype),
                " tensors are not summed (F32 or BF16)");
    exchange(1, x);
    const int64_t n = x.numel();
    std::vector<float> sum(size_t(n), 0.0f);
    for (int r = 0; r < size_; ++r) {
      const void* src = r == rank_ ? x.data : received_[size_t(r)].data();
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += host_value(src, x.dtype, i);
    }
    store_sum(x, sum.data());
  }

  void all_gather(const ops::Context&, TensorView x, TensorView out) override {
    TETRA_CHECK(out.dtype == x.dtype && out.numel() == x.numel() * size_, "all_gather: out holds ", out.numel(),
                " elements, not ", size_, " x ", x.numel());
    exchange(2, x);
    const size_t bytes = size_t(x.nbytes());
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(out.data) + size_t(r) * bytes,
                  r == rank_ ? x.data : static_cast<const void*>(received_[size_t(r)].data()), bytes);
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(abort_->mu);
    if (!abort_->reason.empty()) return;
    abort_->reason = reason;
    for (TcpSocket* s : abort_->sockets) s->shutdown();
  }

  std::vector<TcpSocket>& peers() { return peers_; }

 private:
  [[noreturn]] void abandoned(const std::string& why) {
    const std::string reason = abort_->why();
    fail("a collective was abandoned: ", reason.empty() ? why : reason);
  }

  // A peer's connection closed. A failing node says why on its control link before its
  // sockets close, and that reason reaches abort() here: give it a moment to arrive, so the
  // error names the cause rather than its echo.
  [[noreturn]] void peer_lost(int r, const std::string& why) {
    for (int i = 0; i < 200 && abort_->why().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    abandoned(str_cat("rank ", r, " (", peers_[size_t(r)].peer(), ") was lost: ", why));
  }

  // Sends x (after a header) to every other rank and receives each one's into received_,
  // progressing on every connection at once.
  void exchange(uint32_t op, const TensorView& x) {
    if (const std::string why = abort_->why(); !why.empty()) abandoned(why);
    const Header mine{op, uint32_t(x.dtype), uint64_t(x.nbytes())};
    std::string out(sizeof(Header), '\0');
    std::memcpy(out.data(), &mine, sizeof mine);
    out.append(static_cast<const char*>(x.data), size_t(x.nbytes()));
    received_.resize(size_t(size_));
    std::vector<size_t> sent(size_t(size_), 0), got(size_t(size_), 0);
    for (int r = 0; r < size_; ++r) received_[size_t(r)].assign(r == rank_ ? 0 : out.size(), '\0');
    int pending = 2 * (size_ - 1);
    std::vector<pollfd> fds;
    std::vector<int> fd_rank;
    while (pending > 0) {
      fds.clear();
      fd_rank.clear();
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        short events = 0;
        if (sent[size_t(r)] < out.size()) events |= POLLOUT;
        if (got[size_t(r)] < out.size()) events |= POLLIN;
        if (events) fds.push_back({peers_[size_t(r)].fd(), events, 0}), fd_rank.push_back(r);
      }
      const int rc = ::poll(fds.data(), fds.size(), 200);
      if (const std::string why = abort_->why(); !why.empty()) abandoned(why);
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) abandoned(str_cat("poll failed: ", std::strerror(errno)));
      for (size_t i = 0; i < fds.size(); ++i) {
        const int r = fd_rank[i];
        TcpSocket& s = peers_[size_t(r)];
        if ((fds[i].revents & POLLOUT) && sent[size_t(r)] < out.size()) {
          const ssize_t k = ::send(s.fd(), out.data() + sent[size_t(r)], out.size() - sent[size_t(r)],
                                   MSG_DONTWAIT | MSG_NOSIGNAL);
          if (k < 0 && errno != EAGAIN && errno != EINTR) peer_lost(r, std::strerror(errno));
          if (k > 0 && (sent[size_t(r)] += size_t(k)) == out.size()) --pending;
        }
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && got[size_t(r)] < out.size()) {
          std::string& in = received_[size_t(r)];
          const ssize_t k = ::recv(s.fd(), in.data() + got[size_t(r)], in.size() - got[size_t(r)], MSG_DONTWAIT);
          if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) peer_lost(r, k == 0 ? "closed" : std::strerror(errno));
          if (k <= 0) continue;
          const size_t before = got[size_t(r)];
          got[size_t(r)] += size_t(k);
          if (before < sizeof(Header) && got[size_t(r)] >= sizeof(Header)) {
            Header theirs;
            std::memcpy(&theirs, in.data(), sizeof theirs);
            if (!(theirs == mine)) {
              const std::string why = str_cat("rank ", r, "'s collective differs from rank ", rank_, "'s (",
                                              theirs.bytes, " bytes against ", mine.bytes, ")");
              abort(why);
              abandoned(why);
            }
          }
          if (got[size_t(r)] == out.size()) --pending;
        }
      }
    }
    for (int r = 0; r < size_; ++r)
      if (r != rank_) received_[size_t(r)].erase(0, sizeof(Header));
  }

  int rank_, size_;
  std::vector<TcpSocket> peers_;  // by global rank; this rank's empty
  std::shared_ptr<AbortState> abort_;
  std::vector<std::string> received_;  // the last collective's payload from each rank
};

}  // namespace

std::vector<std::unique_ptr<ops::Communicator>> make_tcp_communicators(NodeGroup& nodes, int first_rank, int n_local,
                                                                       int world) {
  TETRA_CHECK(n_local >= 1 && world == n_local * nodes.nnodes() && first_rank == nodes.node_rank() * n_local,
              "TCP ranks: ", n_local, " a node on ", nodes.nnodes(), " nodes are not ", world, " ranks");
  // Listen where the other nodes reach this one (its control link's address family).
  const std::string& me = nodes.host(nodes.node_rank());
  TcpListener listener(me.find(':') != std::string::npos ? "::" : "0.0.0.0", 0);
  const std::vector<std::string> ports = nodes.all_gather(std::to_string(listener.port()));
  std::vector<std::vector<TcpSocket>> peers(static_cast<size_t>(n_local));
  for (auto& p : peers) p.resize(size_t(world));
  // Each rank connects to every lower rank and says which pair the connection is; the lower
  // rank's node accepts it. Connections queue in the listeners, so all connect first.
  for (int i = 0; i < n_local; ++i) {
    const int from = first_rank + i;
    for (int to = 0; to < from; ++to) {
      const int node = to / n_local;
      TcpSocket s = connect_tcp({nodes.host(node), std::stoi(ports[size_t(node)])}, nodes.timeout_s(),
                                "another rank's node");
      const int32_t pair[2] = {to, from};
      s.send_all(pair, sizeof pair);
      peers[size_t(i)][size_t(to)] = std::move(s);
    }
  }
  int expected = 0;
  for (int i = 0; i < n_local; ++i) expected += world - 1 - (first_rank + i);
  for (int k = 0; k < expected; ++k) {
    TcpSocket s = listener.accept(nodes.timeout_s(), "rank");
    s.set_receive_timeout(nodes.timeout_s());
    int32_t pair[2];
    s.recv_all(pair, sizeof pair);
    s.set_receive_timeout(0);
    const int to = pair[0], from = pair[1];
    TETRA_CHECK(to >= first_rank && to < first_rank + n_local && from > to && from < world &&
                    !peers[size_t(to - first_rank)][size_t(from)].open(),
                "a rank connection from ", s.peer(), " names the pair ", to, " <- ", from,
                ", which this node does not expect");
    peers[size_t(to - first_rank)][size_t(from)] = std::move(s);
  }
  auto abort = std::make_shared<AbortState>();
  std::vector<std::unique_ptr<ops::Communicator>> comms;
  for (int i = 0; i < n_local; ++i) {
    auto c = std::make_unique<TcpCommunicator>(first_rank + i, world, std::move(peers[size_t(i)]), abort);
    for (TcpSocket& s : c->peers())
      if (s.open()) abort->sockets.push_back(&s);
    comms.push_back(std::move(c));
  }
  return comms;
}

}  // namespace tetra::parallel
