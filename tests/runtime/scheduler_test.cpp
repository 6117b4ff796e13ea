// The scheduler without a model: what each step holds, and whom preemption picks. A "step"
// here marks the scheduled tokens computed and, where logits were wanted, appends a token,
// as the engine's post-processing does.
#include <gtest/gtest.h>

#include <memory>

#include "runtime/scheduler.h"

namespace tetra::runtime {
namespace {

struct Fixture {
  Fixture(int64_t n_blocks, int block_size, SchedulerConfig config)
      : blocks(n_blocks, block_size, true), scheduler(config, blocks) {}

  Request* add(int64_t prompt_len, int64_t max_new = 100) {
    RequestParams p;
    p.prompt.assign(size_t(prompt_len), 0);
    for (int64_t i = 0; i < prompt_len; ++i) p.prompt[size_t(i)] = int32_t(1000 * (next + 1) + i);
    p.max_new_tokens = max_new;
    requests.push_back(std::make_unique<Request>(next, next, std::move(p), nullptr));
    ++next;
    scheduler.add(requests.back().get());
    return requests.back().get();
  }

  std::vector<ScheduledChunk> step() {
    auto chunks = scheduler.schedule();
    for (const auto& c : chunks) {
      c.request->n_computed += c.n_tokens;
      if (c.want_logits) c.request->tokens.push_back(7);
    }
    return chunks;
  }

  BlockManager blocks;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Request>> requests;
  uint64_t next = 1;
};

int64_t prompt_tokens_in(const std::vector<ScheduledChunk>& chunks) {
  int64_t n = 0;
  for (const auto& c : chunks)
    if (c.n_tokens > 1 || c.request->n_generated() == 0) n += c.n_tokens;
  return n;
}

TEST(Scheduler, PrefillChunksStayWithinTheBudgetAndDecodesRideAlong) {
  Fixture f(64, 4, {.max_running_requests = 8, .chunked_prefill_size = 5});
  Request* a = f.add(12);
  auto s1 = f.step();
  ASSERT_EQ(s1.size(), 1u);
  EXPECT_EQ(s1[0].n_tokens, 5);
  EXPECT_FALSE(s1[0].want_logits);  // mid-prompt: no logits, no token
  f.step();                         // tokens 5..9
  Request* b = f.add(9);
  auto s3 = f.step();               // a's last 2 prompt tokens, then 3 of b's
  ASSERT_EQ(s3.size(), 2u);
  EXPECT_EQ(s3[0].request, a);
  EXPECT_EQ(s3[0].n_tokens, 2);
  EXPECT_TRUE(s3[0].want_logits);
  EXPECT_EQ(s3[1].request, b);
  EXPECT_EQ(s3[1].n_tokens, 3);
  auto s4 = f.step();               // a decodes (outside the budget) beside 5 of b's
  ASSERT_EQ(s4.size(), 2u);
  EXPECT_EQ(s4[0].n_tokens, 1);
  EXPECT_EQ(s4[1].n_tokens, 5);
  EXPECT_LE(prompt_tokens_in(s4), 5);
}

// `tetra bench decode --skip-prefill`: a prompt is admitted with all its blocks and only its
// last token to run; one preempted recomputes everything, as any other does.
TEST(Scheduler, SkippedPromptForwardRunsOnlyTheLastToken) {
  Fixture f(64, 4, {.max_running_requests = 8, .chunked_prefill_size = 5, .skip_prompt_forward = true});
  Request* a = f.add(30);
  Request* b = f.add(9);
  auto s1 = f.step();
  ASSERT_EQ(s1.size(), 2u);
  for (const auto& c : s1) {
    EXPECT_EQ(c.n_tokens, 1);
    EXPECT_TRUE(c.want_logits);
  }
  EXPECT_EQ(a->table.blocks.size(), 8u);  // 31 tokens by the next step: 8 blocks of 4
  EXPECT_EQ(b->table.blocks.size(), 3u);
  EXPECT_EQ(a->n_computed, 30);
  auto s2 = f.step();
  ASSERT_EQ(s2.size(), 2u);
  EXPECT_EQ(s2[0].n_tokens, 1);  // decodes
  EXPECT_EQ(s2[1].n_tokens, 1);
}

TEST(Scheduler, RunningCapHoldsTheRestInTheQueue) {
  Fixture f(64, 4, {.max_running_requests = 2, .chunked_prefill_size = 100});
  for (int i = 0; i < 4; ++i) f.add(3);
  EXPECT_EQ(f.step().size(), 2u);
  EXPECT_EQ(f.scheduler.n_running(), 2);
  EXPECT_EQ(f.scheduler.n_waiting(), 2);
}

TEST(Scheduler, PreemptsTheLatestArrivalToTheFrontAndRecomputesItsTokens) {
  // 6 blocks of 2 tokens and room for two running requests: a and b grow until the pool is
  // out, while c and d wait for a slot.
  Fixture f(6, 2, {.max_running_requests = 2, .chunked_prefill_size = 100});
  Request* a = f.add(3);
  Request* b = f.add(3);
  f.step();
  Request* c = f.add(3);
  Request* d = f.add(3);
  while (f.scheduler.stats().preemptions == 0) ASSERT_FALSE(f.step().empty());
  EXPECT_EQ(a->state, RequestState::Running);
  EXPECT_EQ(b->state, RequestState::Waiting);
  EXPECT_EQ(b->n_computed, 0);
  EXPECT_TRUE(b->table.blocks.empty());
  EXPECT_GT(b->n_generated(), 0);  // its tokens stay, to be recomputed
  ASSERT_EQ(f.scheduler.waiting().size(), 3u);
  EXPECT_EQ(f.scheduler.waiting()[0], b);  // ahead of c and d, which never ran
  EXPECT_EQ(f.scheduler.waiting()[1], c);
  EXPECT_EQ(f.scheduler.waiting()[2], d);

  // a finishes; b comes back first and runs every token it had in one chunk, with logits.
  const int64_t b_tokens = b->n_tokens();
  f.scheduler.remove(a);
  auto s = f.step();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s[0].request, b);
  EXPECT_EQ(s[0].n_tokens, b_tokens);
  EXPECT_TRUE(s[0].want_logits);
  EXPECT_EQ(b->n_generated(), b_tokens - 3 + 1);
}

TEST(Scheduler, DecodeGroupsNeedEveryRunningRequestInDecode) {
  Fixture f(64, 4, {.max_running_requests = 8, .chunked_prefill_size = 4});
  f.add(3);
  f.add(6);
  f.step();  // the first prompt whole, 1 token of the second
  EXPECT_TRUE(f.scheduler.schedule_decodes().empty());
  f.step();  // the rest of the second
  const auto decodes = f.scheduler.schedule_decodes();
  ASSERT_EQ(decodes.size(), 2u);
  for (const auto& c : decodes) {
    EXPECT_EQ(c.n_tokens, 1);
    EXPECT_TRUE(c.want_logits);
  }
  f.add(2);  // a queued request ends grouping
  EXPECT_TRUE(f.scheduler.schedule_decodes().empty());
}

}  // namespace
}  // namespace tetra::runtime
