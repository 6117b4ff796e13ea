// Nodes of one server joined over loopback, each node a thread here: the join (and its
// refusals), the startup exchanges, steps and their answers, and a node that fails or is lost
// ending the group on every node, never leaving one waiting. Then CPU ranks over TCP: the same
// bits as ranks that are threads of one process.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/ops.h"
#include "parallel/cpu_communicator.h"
#include "parallel/node_group.h"
#include "parallel/rank_threads.h"
#include "parallel/tcp_communicator.h"

namespace tetra::parallel {
namespace {

int free_port() {
  TcpListener probe("127.0.0.1", 0);
  return probe.port();
}

NodeOptions node(int rank, int n, int port, double timeout_s = 20) {
  return {.nnodes = n, .node_rank = rank, .dist_init_addr = str_cat("127.0.0.1:", port), .timeout_s = timeout_s};
}

const Fingerprint kSame = {{"--tp", "2"}, {"the model", "tiny"}};

// n nodes joined at once, each from its own thread (as separate processes would).
std::vector<std::unique_ptr<NodeGroup>> join_all(int n, const std::vector<Fingerprint>& prints = {}) {
  const int port = free_port();
  std::vector<std::future<std::unique_ptr<NodeGroup>>> joining;
  for (int k = 0; k < n; ++k)
    joining.push_back(std::async(std::launch::async, [=] {
      return NodeGroup::join(node(k, n, port), prints.empty() ? kSame : prints[size_t(k)]);
    }));
  std::vector<std::unique_ptr<NodeGroup>> nodes;
  for (auto& j : joining) nodes.push_back(j.get());
  return nodes;
}

TEST(NodeGroup, StringsEncodeAndDecodeAndMalformedOnesAreRefused) {
  const std::vector<std::string> parts = {"", "a", std::string(300, 'x'), std::string("\0z", 2)};
  EXPECT_EQ(decode_strings(encode_strings(parts)), parts);
  const std::string good = encode_strings(parts);
  EXPECT_THROW(decode_strings(good.substr(0, good.size() - 1)), Error);
  EXPECT_THROW(decode_strings(good + "!"), Error);
  EXPECT_THROW(decode_strings("\xff\xff\xff\x7f"), Error);
  EXPECT_THROW(decode_strings(""), Error);
}

TEST(NodeGroup, OptionsAreCheckedBeforeAnythingStarts) {
  EXPECT_NO_THROW(check_node_options({}, 1));
  EXPECT_NO_THROW(check_node_options(node(1, 2, 5000), 4));
  auto message = [](const NodeOptions& o, int world) {
    try {
      check_node_options(o, world);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(node(2, 2, 5000), 2).find("--node-rank must be in [0, 2)"), std::string::npos);
  EXPECT_NE(message({.nnodes = 2}, 2).find("needs --dist-init-addr"), std::string::npos);
  EXPECT_NE(message(node(0, 2, 5000), 3).find("--nnodes 2 must divide the 3 ranks"), std::string::npos);
  NodeOptions bad = node(0, 2, 5000);
  bad.dist_init_addr = "localhost";
  EXPECT_NE(message(bad, 2).find("HOST:PORT"), std::string::npos);
  bad.dist_init_addr = "localhost:70000";
  EXPECT_NE(message(bad, 2).find("[1, 65535]"), std::string::npos);
  EXPECT_EQ(parse_host_port("[::1]:80", "x").host, "::1");
}

TEST(NodeGroup, NodesJoinExchangeAndRunSteps) {
  auto nodes = join_all(3);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(nodes[size_t(k)]->node_rank(), k);
    EXPECT_EQ(nodes[size_t(k)]->host(0), "127.0.0.1");
    EXPECT_EQ(nodes[size_t(k)]->host(2), "127.0.0.1");
  }
  // Every node gets every node's part, in node order.
  std::vector<std::future<std::vector<std::string>>> got;
  for (int k = 0; k < 3; ++k)
    got.push_back(std::async(std::launch::async, [&, k] { return nodes[size_t(k)]->all_gather(str_cat("n", k)); }));
  for (auto& g : got) EXPECT_EQ(g.get(), (std::vector<std::string>{"n0", "n1", "n2"}));
  // Steps in order, then stop.
  std::vector<std::thread> followers;
  std::vector<std::vector<std::string>> seen(3);
  for (int k = 1; k < 3; ++k)
    followers.emplace_back([&, k] {
      while (auto order = nodes[size_t(k)]->next_order()) {
        seen[size_t(k)].push_back(*order);
        nodes[size_t(k)]->answer("");
      }
    });
  for (const char* step : {"step a", "step b", "step c"}) {
    nodes[0]->send_order(step);
    EXPECT_NO_THROW(nodes[0]->wait_answers());
  }
  nodes[0]->stop();
  for (auto& t : followers) t.join();
  for (int k = 1; k < 3; ++k) EXPECT_EQ(seen[size_t(k)], (std::vector<std::string>{"step a", "step b", "step c"}));
  EXPECT_EQ(nodes[1]->failure(), "");
}

TEST(NodeGroup, ANodeWithOtherFlagsIsRefusedOnBothSidesWithTheDifferenceNamed) {
  const int port = free_port();
  auto zero = std::async(std::launch::async, [&] { return NodeGroup::join(node(0, 2, port), kSame); });
  const Fingerprint other = {{"--tp", "4"}, {"the model", "tiny"}};
  try {
    NodeGroup::join(node(1, 2, port), other);
    FAIL() << "node 1 joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 0 refused this node: node 1 has --tp 4 where node 0 has 2"),
              std::string::npos)
        << e.what();
  }
  try {
    zero.get();
    FAIL() << "node 0 started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("every node must be started with the same model and flags"),
              std::string::npos)
        << e.what();
  }
}

TEST(NodeGroup, ANodeThatNeverComesIsNamedWhenTheWaitEnds) {
  const int port = free_port();
  try {
    NodeGroup::join(node(0, 3, port, 0.5), kSame);
    FAIL() << "node 0 started alone";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node(s) 1, 2 of 3 did not join"), std::string::npos) << e.what();
  }
}

TEST(NodeGroup, AFailedStepEndsTheGroupOnEveryNode) {
  auto nodes = join_all(3);
  std::atomic<int> aborted{0};
  for (auto& n : nodes) n->on_abort([&](const std::string&) { ++aborted; });
  std::thread one([&] {
    ASSERT_TRUE(nodes[1]->next_order());
    nodes[1]->answer("rank 1 ran out of memory");
  });
  std::thread two([&] {
    ASSERT_TRUE(nodes[2]->next_order());
    nodes[2]->answer("");
  });
  nodes[0]->send_order("step");
  try {
    nodes[0]->wait_answers();
    FAIL() << "the step did not fail";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "node 1: rank 1 ran out of memory");
  }
  one.join();
  two.join();
  // Node 0 heard it and told node 2; node 1 hears it back.
  for (int i = 0; i < 200 && aborted.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(aborted.load(), 3);
  for (auto& n : nodes) EXPECT_EQ(n->failure(), "node 1: rank 1 ran out of memory");
}

TEST(NodeGroup, ALostNodeEndsTheGroupAndNodeZerosWaitThrows) {
  auto nodes = join_all(2);
  std::promise<std::string> heard;
  nodes[0]->on_abort([&](const std::string& why) { heard.set_value(why); });
  nodes[1].reset();  // gone without a word, as a killed process
  const std::string why = heard.get_future().get();
  EXPECT_NE(why.find("node 1 (127.0.0.1:"), std::string::npos) << why;
  EXPECT_NE(why.find("was lost"), std::string::npos) << why;
  nodes[0]->send_order("step");
  EXPECT_THROW(nodes[0]->wait_answers(), Error);
}

TEST(NodeGroup, NodeZeroStoppingAfterAFailureTellsTheOthersWhy) {
  auto nodes = join_all(2);
  nodes[0]->abort("node 0 failed");  // a failing node says so first ...
  nodes[0].reset();                  // ... then stops the others as its process ends
  EXPECT_EQ(nodes[1]->next_order(), std::nullopt);
  EXPECT_EQ(nodes[1]->failure(), "node 0 failed");
}

// --- CPU ranks over TCP ---

TensorView view(std::vector<float>& v) { return {v.data(), DType::F32, {int64_t(v.size())}, Device::Cpu}; }

// n_nodes nodes of `local` ranks each; comms[global rank].
struct TcpRanks {
  TcpRanks(int n_nodes, int local) {
    nodes = join_all(n_nodes);
    std::vector<std::future<std::vector<std::unique_ptr<ops::Communicator>>>> making;
    for (int k = 0; k < n_nodes; ++k)
      making.push_back(std::async(std::launch::async, [&, k] {
        return make_tcp_communicators(*nodes[size_t(k)], k * local, local, n_nodes * local);
      }));
    for (auto& m : making)
      for (auto& c : m.get()) comms.push_back(std::move(c));
  }
  std::vector<std::unique_ptr<NodeGroup>> nodes;
  std::vector<std::unique_ptr<ops::Communicator>> comms;
};

// fn(rank) on a thread a rank; aborts every rank's communicator when one throws.
void on_every_rank(std::vector<std::unique_ptr<ops::Communicator>>& comms, const std::function<void(int)>& fn) {
  RankThreads threads(int(comms.size()), [&](const std::string& why) {
    for (auto& c : comms) c->abort(why);
  });
  threads.run(fn);
}

TEST(TcpCommunicator, SumsAndGathersAsRanksInOneProcessDo) {
  TcpRanks tcp(2, 2);
  ASSERT_EQ(tcp.comms.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(tcp.comms[size_t(r)]->rank(), r);
    EXPECT_EQ(tcp.comms[size_t(r)]->size(), 4);
  }
  auto local = make_cpu_communicators(4);
  std::mt19937 rng(3);
  std::normal_distribution<float> value(0.0f, 1e4f);
  // Sizes that cross socket buffers (a pair that waited on each other's send would hang here).
  for (int64_t n : {1, 1000, 1 << 20}) {
    std::vector<std::vector<float>> x(4), y(4);
    std::vector<std::vector<uint16_t>> xb(4), yb(4);
    for (int r = 0; r < 4; ++r)
      for (int64_t i = 0; i < n; ++i) {
        x[size_t(r)].push_back(value(rng));
        xb[size_t(r)].push_back(f32_to_bf16(value(rng)));
      }
    y = x;
    yb = xb;
    ops::Context ctx;
    auto bf16 = [&](std::vector<uint16_t>& v) { return TensorView{v.data(), DType::BF16, {n}, Device::Cpu}; };
    on_every_rank(tcp.comms, [&](int r) {
      tcp.comms[size_t(r)]->all_reduce_sum(ctx, view(x[size_t(r)]));
      tcp.comms[size_t(r)]->all_reduce_sum(ctx, bf16(xb[size_t(r)]));
    });
    on_every_rank(local, [&](int r) {
      local[size_t(r)]->all_reduce_sum(ctx, view(y[size_t(r)]));
      local[size_t(r)]->all_reduce_sum(ctx, bf16(yb[size_t(r)]));
    });
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(std::memcmp(x[size_t(r)].data(), y[0].data(), size_t(n) * 4), 0) << "rank " << r << ", n " << n;
      EXPECT_EQ(xb[size_t(r)], yb[0]) << "rank " << r << ", n " << n;
    }
  }
  std::vector<std::vector<float>> part(4), all(4, std::vector<float>(12));
  for (int r = 0; r < 4; ++r) part[size_t(r)] = {float(r), float(r) + 0.5f, float(r) + 0.25f};
  ops::Context ctx;
  on_every_rank(tcp.comms, [&](int r) {
    tcp.comms[size_t(r)]->all_gather(ctx, view(part[size_t(r)]), view(all[size_t(r)]));
  });
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i < 3; ++i) EXPECT_EQ(all[size_t(r)][size_t(3 * s + i)], part[size_t(s)][size_t(i)]);
}

TEST(TcpCommunicator, AFailedRankFreesTheOthersWithItsReason) {
  TcpRanks tcp(2, 1);
  std::vector<float> a(8, 1.0f);
  ops::Context ctx;
  try {
    on_every_rank(tcp.comms, [&](int r) {
      if (r == 1) fail("rank 1 broke");
      tcp.comms[0]->all_reduce_sum(ctx, view(a));
    });
    FAIL() << "the collective finished";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 broke");
  }
  EXPECT_THROW(tcp.comms[0]->all_reduce_sum(ctx, view(a)), Error);
}

TEST(TcpCommunicator, RanksThatDisagreeOnTheTensorFailInsteadOfMisreading) {
  TcpRanks tcp(2, 1);
  std::vector<std::vector<float>> x = {std::vector<float>(8, 1.0f), std::vector<float>(9, 1.0f)};
  ops::Context ctx;
  try {
    on_every_rank(tcp.comms, [&](int r) { tcp.comms[size_t(r)]->all_reduce_sum(ctx, view(x[size_t(r)])); });
    FAIL() << "the collective finished";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collective differs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tetra::parallel
