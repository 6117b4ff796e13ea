// The nodes (hosts) of one server: --nnodes, --node-rank, --dist-init-addr, as SGLang names
// them. Node 0 serves: the HTTP API, the scheduler, the sampler. Every node holds world /
// nnodes ranks of the model (node k the ranks from k * world / nnodes on) and starts the same
// way (the startup is the same code in the same order on every node, so their collectives
// meet); after it node 0 sends each step to the others, which run their ranks' share of it
// and answer.
//
// One TCP connection from each node to node 0 carries the joining, the startup exchanges and
// the steps. The ranks' collectives travel apart: NCCL (its communicator made from an id node
// 0 sends here), or TCP between CPU ranks (parallel/tcp_communicator.h).
//
// Failure: a node whose link drops, or whose ranks fail, ends the group at once. on_abort runs
// on every node still standing (its ranks' collectives then throw instead of waiting), node 0's
// step fails and its server drains and exits 1; the other nodes exit 1 when node 0 goes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "parallel/tcp_socket.h"

namespace tetra::parallel {

struct NodeOptions {
  int nnodes = 1, node_rank = 0;
  std::string dist_init_addr;  // HOST:PORT node 0 listens at
  double timeout_s = 600;      // to join, and for the ranks' connections
};

// Throws one sentence for a bad combination (checked before anything loads): node_rank in
// [0, nnodes), an address with several nodes, `world` ranks a multiple of nnodes.
void check_node_options(const NodeOptions& o, int world);

// What every node must agree on (flags, the model's shape), as (name, value) pairs in order.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

// Strings to one string and back (length-prefixed); decode throws on a malformed one.
std::string encode_strings(const std::vector<std::string>& parts);
std::vector<std::string> decode_strings(std::string_view bytes);

class NodeGroup {
 public:
  // Node 0 listens at dist_init_addr and waits for the others; the others connect, retrying
  // while node 0 is not listening yet. A node whose nnodes or fingerprint differs from node
  // 0's, or whose node rank another node has, is refused with the difference named, on that
  // node and on node 0. Throws once timeout_s passes with a node missing.
  static std::unique_ptr<NodeGroup> join(const NodeOptions& o, const Fingerprint& fingerprint);
  ~NodeGroup();
  NodeGroup(const NodeGroup&) = delete;
  NodeGroup& operator=(const NodeGroup&) = delete;

  int node_rank() const { return options_.node_rank; }
  int nnodes() const { return options_.nnodes; }
  double timeout_s() const { return options_.timeout_s; }
  // Node k's host as the other nodes reach it.
  const std::string& host(int node) const { return hosts_[size_t(node)]; }

  // Collective, for the startup: every node calls it in the same order. Every node's `mine`,
  // in node order.
  std::vector<std::string> all_gather(const std::string& mine);

  // Node 0: the next step to every other node; then their answers, throwing the first
  // failure a node reports (or that a node was lost).
  void send_order(std::string_view order);
  void wait_answers();
  // Node 0: the other nodes' next_order returns nullopt. Once; the destructor calls it.
  void stop();

  // The other nodes: node 0's next order, or nullopt once it said stop. Throws once node 0 is
  // lost or the group was aborted.
  std::optional<std::string> next_order();
  void answer(const std::string& error);  // empty: the step ran

  // fn(reason) runs once when the group must end: a node lost, a node's ranks failed. It is
  // called on a link's reader thread, or from abort().
  void on_abort(std::function<void(const std::string&)> fn);
  // This node's ranks failed: the other nodes are told (their on_abort runs) and this node's
  // own on_abort runs too. The first reason stays.
  void abort(const std::string& reason);
  // Why the group ended; empty while it stands.
  std::string failure() const;

 private:
  struct Link;
  explicit NodeGroup(const NodeOptions& o);
  void start_readers();
  void read_loop(Link& link);
  void lost(Link& link, const std::string& why);
  void trigger_abort(const std::string& reason);
  void send(Link& link, char type, std::string_view payload);
  std::string take_exchange(Link& link);

  NodeOptions options_;
  std::vector<std::string> hosts_;
  std::vector<std::unique_ptr<Link>> links_;  // node 0: one a node (index node - 1); others: one, to node 0
  bool joined_ = false;                       // every link made (a failed join has gaps)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::optional<std::string>> orders_;  // the other nodes: steps, nullopt for stop
  bool closing_ = false, stopped_ = false;
  std::string aborted_;  // why the group ended; empty while it stands
  std::function<void(const std::string&)> on_abort_;
  bool abort_called_ = false;
};

}  // namespace tetra::parallel
