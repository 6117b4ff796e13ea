// The serving engine over several ranks (--tp/--ep on the CPU): batched, chunked and
// preempted requests get the tokens one rank gives them, and a rank that fails mid-step ends
// the step (and every later one) with an error instead of leaving the others waiting.
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "engine_test_util.h"
#include "runtime/ranks.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::EngineConfig;
using runtime::FinishReason;
using testing::Collector;

std::unique_ptr<runtime::ModelRanks> ranks(int tp, int ep) {
  return runtime::load_ranks(testing::tiny_model_dir(), {.device = "cpu", .n_threads = 1}, {tp, ep}, {});
}

std::vector<runtime::RequestParams> requests(int64_t vocab) {
  std::mt19937 rng(3);
  std::vector<runtime::RequestParams> out;
  for (int i = 0; i < 12; ++i)
    out.push_back(testing::greedy(testing::random_prompt(rng, 1 + (i * 7 + 3) % 40, vocab), 3 + (i * 5) % 12));
  return out;
}

// Staggered arrivals under a small prefill budget, a running cap and a KV pool small enough
// to preempt: every request's tokens and log-probs against one rank's.
std::vector<testing::Collected> serve(runtime::ModelRanks& r, const std::vector<runtime::RequestParams>& reqs,
                                      runtime::EngineStats* stats, bool padded_graph_steps = false) {
  EngineConfig c = testing::small_config();
  c.testing_eager_decode_graphs = padded_graph_steps;
  c.block_size = 4;
  c.kv_blocks = 16;  // the longest request needs 13 blocks; four at once cannot fit
  c.chunked_prefill_size = 9;
  c.max_running_requests = 4;
  Engine engine(r, c);
  Collector out;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ids.push_back(testing::submit_ok(engine, reqs[i], out));
    if (i % 2) engine.step();
  }
  testing::drain(engine);
  *stats = engine.stats();
  std::vector<testing::Collected> got;
  for (uint64_t id : ids) got.push_back(out.by_id[id]);
  return got;
}

// The engine's steps run on a thread of their own, so a hang fails the test instead of
// stopping it.
void drain_or_fail(Engine& engine) {
  auto done = std::async(std::launch::async, [&] { testing::drain(engine); });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the ranks hung";
  done.get();
}

// Every request's tokens equal one rank's, log-probs within 1e-4.
void expect_one_ranks_tokens(const std::vector<testing::Collected>& got, const std::vector<testing::Collected>& want,
                             const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << " request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << what << " request " << i;
    for (size_t t = 0; t < want[i].logprobs.size(); ++t)
      EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], 1e-4) << what << " request " << i << " token " << t;
  }
}

TEST(EngineParallel, RanksServeTheTokensOneRankServes) {
  auto one = ranks(1, 1);
  const auto reqs = requests(one->model().config().vocab_size);
  runtime::EngineStats s1;
  const auto want = serve(*one, reqs, &s1);
  for (auto [tp, ep] : {std::pair{2, 2}, {2, 1}, {1, 2}}) {
    auto split = ranks(tp, ep);
    runtime::EngineStats s;
    const auto got = serve(*split, reqs, &s);
    EXPECT_GT(s.preemptions, 0) << "the KV pool was meant to preempt";
    EXPECT_EQ(s.kv_blocks_used, 0);
    expect_one_ranks_tokens(got, want, str_cat("tp ", tp, " ep ", ep));
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].finish, FinishReason::Length) << "request " << i;
  }
}

// Decode steps padded as every rank's graph replay pads them (each rank runs its own), run
// eagerly: the tokens one rank serves.
TEST(EngineParallel, EveryRanksPaddedGraphStepsServeTheTokensOneRankServes) {
  auto one = ranks(1, 1);
  const auto reqs = requests(one->model().config().vocab_size);
  runtime::EngineStats s1;
  const auto want = serve(*one, reqs, &s1);
  auto split = ranks(2, 2);
  runtime::EngineStats s;
  const auto got = serve(*split, reqs, &s, true);
  EXPECT_GT(s.graph_steps, 0);
  expect_one_ranks_tokens(got, want, "tp 2 ep 2, padded graph steps");
}

// A rank that fails at a graph step: the step fails, and so does every later one, because the
// group refuses to run again (a graph's collectives would not ask the host).
TEST(EngineParallel, ARankThatFailsAtAGraphStepEndsTheGroup) {
  auto split = ranks(2, 1);
  EngineConfig c = testing::small_config();
  c.testing_eager_decode_graphs = true;
  c.testing_fail_step = 2;  // the prompt is step 0; steps 1 and 2 decode one token each
  c.testing_fail_rank = 1;
  Engine engine(*split, c);
  Collector out;
  const auto reqs = requests(split->model().config().vocab_size);
  const uint64_t a = testing::submit_ok(engine, testing::greedy({3, 4, 5}, 6), out);
  drain_or_fail(engine);
  EXPECT_EQ(out.by_id[a].finish, FinishReason::Error);
  EXPECT_EQ(engine.stats().graph_steps, 1);
  EXPECT_EQ(engine.stats().failed_steps, 1);
  const uint64_t b = testing::submit_ok(engine, reqs[1], out);
  drain_or_fail(engine);
  EXPECT_EQ(out.by_id[b].finish, FinishReason::Error);
  EXPECT_NE(out.by_id[b].error.find("the ranks stopped after a failure"), std::string::npos) << out.by_id[b].error;
}

TEST(EngineParallel, ARankThatFailsEndsTheStepAndTheGroupWithoutHanging) {
  auto split = ranks(2, 2);
  EngineConfig c = testing::small_config();
  c.testing_fail_step = 1;
  c.testing_fail_rank = 1;
  Engine engine(*split, c);
  Collector out;
  const auto reqs = requests(split->model().config().vocab_size);
  const uint64_t a = testing::submit_ok(engine, reqs[0], out);
  drain_or_fail(engine);
  EXPECT_EQ(out.by_id[a].finish, FinishReason::Error);
  EXPECT_EQ(engine.stats().failed_steps, 1);
  // The group stays aborted: the next request fails at once too.
  const uint64_t b = testing::submit_ok(engine, reqs[1], out);
  drain_or_fail(engine);
  EXPECT_EQ(out.by_id[b].finish, FinishReason::Error);
  EXPECT_EQ(engine.stats().failed_steps, 2);
}

}  // namespace
}  // namespace tetra
