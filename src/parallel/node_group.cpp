#include "parallel/node_group.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace tetra::parallel {
namespace {

constexpr const char* kHello = "tetra-node-1";
constexpr size_t kMaxMessage = size_t(256) << 20;  // a step of the largest batches is a few MiB

// Message types, the first byte of every frame after the join.
constexpr char kExchange = 'X';  // startup all_gather, both ways
constexpr char kOrder = 'S';     // node 0 -> node: run this step
constexpr char kStop = 'Q';      // node 0 -> node: no more steps
constexpr char kAnswer = 'R';    // node -> node 0: the step ran (empty) or why not
constexpr char kAbort = 'A';     // either way: the group ends, with this reason

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(char(uint8_t(v >> (8 * i))));
}

uint32_t get_u32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(s[at + size_t(i)])) << (8 * i);
  return v;
}

int parse_int(const std::string& s, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  TETRA_CHECK(!s.empty() && *end == '\0', "a joining node sent a malformed ", what, ": '", s, "'");
  return int(v);
}

// The first (name, value) where node `rank`'s hello (after its 3 leading fields) differs from
// node 0's fingerprint, as the sentence that refuses it; empty when they agree.
std::string fingerprint_difference(int rank, const std::vector<std::string>& hello, const Fingerprint& mine) {
  const size_t theirs = (hello.size() - 3) / 2;
  for (size_t i = 0; i < std::max(theirs, mine.size()); ++i) {
    const std::string key = i < theirs ? hello[3 + 2 * i] : mine[i].first;
    const std::string ours = i < mine.size() && mine[i].first == key ? mine[i].second : "(none)";
    const std::string their = i < theirs ? hello[4 + 2 * i] : "(none)";
    if (ours != their)
      return str_cat("node ", rank, " has ", key, " ", their, " where node 0 has ", ours,
                     ": every node must be started with the same model and flags");
  }
  return {};
}

}  // namespace

void check_node_options(const NodeOptions& o, int world) {
  TETRA_CHECK(o.nnodes >= 1, "--nnodes must be at least 1, not ", o.nnodes);
  TETRA_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank must be in [0, ", o.nnodes, "), not ",
              o.node_rank);
  if (o.nnodes == 1) return;
  TETRA_CHECK(!o.dist_init_addr.empty(), "--nnodes ", o.nnodes, " needs --dist-init-addr HOST:PORT: where node 0 "
              "listens for the other nodes");
  parse_host_port(o.dist_init_addr, "--dist-init-addr");
  TETRA_CHECK(world % o.nnodes == 0, "--nnodes ", o.nnodes, " must divide the ", world,
              " ranks of --tp/--ep: every node holds as many");
  TETRA_CHECK(o.timeout_s > 0, "--dist-timeout must be positive");
}

std::string encode_strings(const std::vector<std::string>& parts) {
  std::string out;
  put_u32(out, uint32_t(parts.size()));
  for (const auto& p : parts) {
    put_u32(out, uint32_t(p.size()));
    out += p;
  }
  return out;
}

std::vector<std::string> decode_strings(std::string_view bytes) {
  TETRA_CHECK(bytes.size() >= 4, "a malformed message between nodes (", bytes.size(), " bytes)");
  const uint32_t n = get_u32(bytes, 0);
  TETRA_CHECK(n <= bytes.size() / 4, "a malformed message between nodes (", n, " parts in ", bytes.size(),
              " bytes)");
  std::vector<std::string> parts;
  size_t at = 4;
  for (uint32_t i = 0; i < n; ++i) {
    TETRA_CHECK(at + 4 <= bytes.size(), "a malformed message between nodes (cut short)");
    const size_t len = get_u32(bytes, at);
    at += 4;
    TETRA_CHECK(len <= bytes.size() - at, "a malformed message between nodes (cut short)");
    parts.emplace_back(bytes.substr(at, len));
    at += len;
  }
  TETRA_CHECK(at == bytes.size(), "a malformed message between nodes (", bytes.size() - at, " bytes left over)");
  return parts;
}

struct NodeGroup::Link {
  int node = 0;  // the node at the other end
  TcpSocket sock;
  std::mutex send_mu;
  std::thread reader;
  std::deque<std::string> exchanges, answers;
  bool lost = false, stopped = false;  // stopped: the other end said stop, so its close is no loss
  std::string lost_why;
};

NodeGroup::NodeGroup(const NodeOptions& o) : options_(o), hosts_(size_t(o.nnodes)) {}

std::unique_ptr<NodeGroup> NodeGroup::join(const NodeOptions& o, const Fingerprint& fingerprint) {
  TETRA_CHECK(o.nnodes >= 2, "a node group needs at least two nodes");
  const HostPort init = parse_host_port(o.dist_init_addr, "--dist-init-addr");
  std::unique_ptr<NodeGroup> g(new NodeGroup(o));
  if (o.node_rank == 0) {
    TcpListener listener(init.host, init.port);
    g->hosts_[0] = init.host;
    g->links_.resize(size_t(o.nnodes - 1));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
    for (int joined = 0; joined < o.nnodes - 1;) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      TcpSocket s;
      try {
        s = listener.accept(std::max(left, 0.001), "node");
      } catch (const Error&) {
        std::string missing;
        for (int k = 1; k < o.nnodes; ++k)
          if (!g->links_[size_t(k - 1)]) missing += str_cat(missing.empty() ? "" : ", ", k);
        fail("node(s) ", missing, " of ", o.nnodes, " did not join at ", init.str(), " within ", o.timeout_s,
             " s (--dist-timeout)");
      }
      std::vector<std::string> hello;
      try {
        s.set_receive_timeout(10);
        hello = decode_strings(s.recv_frame(1 << 20));
        s.set_receive_timeout(0);
      } catch (const Error& e) {
        log_warn("a connection from ", s.peer(), " to --dist-init-addr is no tetra node: ", e.what());
        continue;
      }
      if (hello.size() < 3 || hello.size() % 2 == 0 || hello[0] != kHello) {
        log_warn("a connection from ", s.peer(), " to --dist-init-addr is no tetra node of this version");
        continue;
      }
      const int rank = parse_int(hello[1], "node rank"), nn = parse_int(hello[2], "node count");
      std::string refusal;
      if (nn != o.nnodes) {
        refusal = str_cat("node ", rank, " was started with --nnodes ", nn, ", node 0 with ", o.nnodes);
      } else if (rank < 1 || rank >= o.nnodes) {
        refusal = str_cat("a node joined with --node-rank ", rank, "; the others are 1 .. ", o.nnodes - 1);
      } else if (g->links_[size_t(rank - 1)]) {
        refusal = str_cat("two nodes joined as node ", rank, " (", g->links_[size_t(rank - 1)]->sock.peer(),
                          " and ", s.peer(), ")");
      } else {
        refusal = fingerprint_difference(rank, hello, fingerprint);
      }
      if (!refusal.empty()) {
        try {
          s.send_frame("N" + refusal);
        } catch (const Error&) {
        }
        fail(refusal);
      }
      auto link = std::make_unique<Link>();
      link->node = rank;
      g->hosts_[size_t(rank)] = s.peer_host();
      link->sock = std::move(s);
      g->links_[size_t(rank - 1)] = std::move(link);
      ++joined;
    }
    std::string welcome = "W";
    welcome += encode_strings(g->hosts_);
    for (auto& l : g->links_) l->sock.send_frame(welcome);
  } else {
    TcpSocket s = connect_tcp(init, o.timeout_s, "node 0 (--dist-init-addr)");
    std::vector<std::string> hello = {kHello, std::to_string(o.node_rank), std::to_string(o.nnodes)};
    for (const auto& [k, v] : fingerprint) hello.insert(hello.end(), {k, v});
    s.send_frame(encode_strings(hello));
    s.set_receive_timeout(o.timeout_s);  // node 0 answers once every node has joined
    std::string reply;
    try {
      reply = s.recv_frame(1 << 20);
    } catch (const Error& e) {
      fail("node 0 at ", init.str(), " did not welcome this node: ", e.what());
    }
    s.set_receive_timeout(0);
    TETRA_CHECK(!reply.empty() && (reply[0] == 'W' || reply[0] == 'N'), "node 0 at ", init.str(),
                " sent a malformed welcome");
    if (reply[0] == 'N') fail("node 0 refused this node: ", reply.substr(1));
    g->hosts_ = decode_strings(std::string_view(reply).substr(1));
    TETRA_CHECK(int(g->hosts_.size()) == o.nnodes, "node 0 sent ", g->hosts_.size(), " hosts for ", o.nnodes,
                " nodes");
    auto link = std::make_unique<Link>();
    link->node = 0;
    link->sock = std::move(s);
    g->links_.push_back(std::move(link));
  }
  g->start_readers();
  g->joined_ = true;
  return g;
}

NodeGroup::~NodeGroup() {
  if (joined_ && node_rank() == 0) stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  for (auto& l : links_)
    if (l) l->sock.shutdown();
  for (auto& l : links_)
    if (l && l->reader.joinable()) l->reader.join();
}

void NodeGroup::start_readers() {
  for (auto& l : links_) l->reader = std::thread([this, &link = *l] { read_loop(link); });
}

void NodeGroup::read_loop(Link& link) {
  for (;;) {
    std::string frame;
    try {
      frame = link.sock.recv_frame(kMaxMessage);
      TETRA_CHECK(!frame.empty(), "an empty message");
    } catch (const std::exception& e) {
      return lost(link, e.what());
    }
    const char type = frame[0];
    std::string payload = frame.substr(1);
    if (type == kAbort) {
      trigger_abort(payload);
      continue;
    }
    if (type != kExchange && type != kOrder && type != kStop && type != kAnswer)
      return lost(link, str_cat("it sent a message of unknown type ", int(uint8_t(type))));
    const std::string failure = type == kAnswer && !payload.empty() ? str_cat("node ", link.node, ": ", payload) : "";
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (type == kExchange) link.exchanges.push_back(std::move(payload));
      if (type == kAnswer) link.answers.push_back(failure);
      if (type == kOrder) orders_.push_back(std::move(payload));
      if (type == kStop) {
        orders_.push_back(std::nullopt);
        link.stopped = true;
      }
      cv_.notify_all();
    }
    if (!failure.empty()) trigger_abort(failure);
  }
}

void NodeGroup::lost(Link& link, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || link.stopped) return;
    link.lost = true;
    link.lost_why = str_cat("node ", link.node, " (", link.sock.peer(), ") was lost: ", why);
    cv_.notify_all();
  }
  trigger_abort(link.lost_why);
}

void NodeGroup::on_abort(std::function<void(const std::string&)> fn) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    on_abort_ = fn;
    if (!abort_called_) return;
    reason = aborted_;
  }
  fn(reason);  // the group ended before anyone listened
}

void NodeGroup::abort(const std::string& reason) { trigger_abort(reason); }

std::string NodeGroup::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

void NodeGroup::trigger_abort(const std::string& reason) {
  std::function<void(const std::string&)> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_called_) return;
    abort_called_ = true;
    aborted_ = reason.empty() ? "a node failed" : reason;
    fn = on_abort_;
    cv_.notify_all();
  }
  for (auto& l : links_) {
    try {
      send(*l, kAbort, aborted_);
    } catch (const Error&) {
      // that node is gone already
    }
  }
  if (fn) fn(aborted_);
}

void NodeGroup::send(Link& link, char type, std::string_view payload) {
  std::string frame(1, type);
  frame.append(payload);
  std::lock_guard<std::mutex> lock(link.send_mu);
  link.sock.send_frame(frame);
}

std::string NodeGroup::take_exchange(Link& link) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !link.exchanges.empty() || link.lost || !aborted_.empty(); });
  if (link.exchanges.empty()) fail("the nodes' startup was abandoned: ", link.lost ? link.lost_why : aborted_);
  std::string s = std::move(link.exchanges.front());
  link.exchanges.pop_front();
  return s;
}

std::vector<std::string> NodeGroup::all_gather(const std::string& mine) {
  if (node_rank() != 0) {
    send(*links_.front(), kExchange, mine);
    std::vector<std::string> all = decode_strings(take_exchange(*links_.front()));
    TETRA_CHECK(int(all.size()) == nnodes(), "node 0 sent ", all.size(), " parts for ", nnodes(), " nodes");
    return all;
  }
  std::vector<std::string> all(static_cast<size_t>(nnodes()));
  all[0] = mine;
  for (auto& l : links_) all[size_t(l->node)] = take_exchange(*l);
  const std::string encoded = encode_strings(all);
  for (auto& l : links_) send(*l, kExchange, encoded);
  return all;
}

void NodeGroup::send_order(std::string_view order) {
  for (auto& l : links_) {
    try {
      send(*l, kOrder, order);
    } catch (const Error& e) {
      lost(*l, e.what());
    }
  }
}

void NodeGroup::wait_answers() {
  std::string first;
  std::unique_lock<std::mutex> lock(mu_);
  for (auto& l : links_) {
    cv_.wait(lock, [&] { return !l->answers.empty() || l->lost; });
    if (!l->answers.empty()) {
      if (first.empty()) first = l->answers.front();
      l->answers.pop_front();
    } else if (first.empty()) {
      first = l->lost_why;
    }
  }
  if (!first.empty()) fail(first);
}

void NodeGroup::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || node_rank() != 0) return;
    stopped_ = closing_ = true;
  }
  for (auto& l : links_) {
    try {
      send(*l, kStop, {});
    } catch (const Error&) {
    }
  }
}

std::optional<std::string> NodeGroup::next_order() {
  std::unique_lock<std::mutex> lock(mu_);
  Link& link = *links_.front();
  cv_.wait(lock, [&] { return !orders_.empty() || link.lost; });
  if (orders_.empty()) fail(link.lost_why);
  std::optional<std::string> o = std::move(orders_.front());
  orders_.pop_front();
  return o;
}

void NodeGroup::answer(const std::string& error) { send(*links_.front(), kAnswer, error); }

}  // namespace tetra::parallel
