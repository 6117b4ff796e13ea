// A step as node 0 sends it to the other nodes: every field survives the trip, and a
// malformed order is refused before any rank would run it.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/step_order.h"

namespace tetra::runtime {
namespace {

TEST(StepOrder, EveryFieldSurvivesTheTrip) {
  const std::vector<int32_t> a = {5, 6, 7}, b = {9}, blocks_a = {0, 3}, blocks_b = {};
  const std::vector<SeqChunk> chunks = {
      {.tokens = a, .start_position = 12, .blocks = blocks_a, .want_logits = false},
      {.tokens = b, .start_position = 0, .blocks = blocks_b, .want_logits = true, .every_logit = true}};
  const StepOrder o = decode_step_order(encode_step_order(chunks, 1, true, 3));
  EXPECT_EQ(o.logit_rows, 1);
  EXPECT_TRUE(o.from_graph);
  EXPECT_EQ(o.fail_rank, 3);
  const std::vector<SeqChunk> got = o.seq_chunks();
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(std::vector<int32_t>(got[i].tokens.begin(), got[i].tokens.end()),
              std::vector<int32_t>(chunks[i].tokens.begin(), chunks[i].tokens.end()));
    EXPECT_EQ(std::vector<int32_t>(got[i].blocks.begin(), got[i].blocks.end()),
              std::vector<int32_t>(chunks[i].blocks.begin(), chunks[i].blocks.end()));
    EXPECT_EQ(got[i].start_position, chunks[i].start_position);
    EXPECT_EQ(got[i].want_logits, chunks[i].want_logits);
    EXPECT_EQ(got[i].every_logit, chunks[i].every_logit);
  }
  EXPECT_TRUE(decode_step_order(encode_step_order({}, 0, false, -1)).chunks.empty());
}

TEST(StepOrder, AMalformedOrderIsRefused) {
  const std::vector<int32_t> a = {5, 6, 7}, blocks = {1};
  const std::string good = encode_step_order({{.tokens = a, .start_position = 0, .blocks = blocks}}, 1, false, -1);
  for (size_t cut = 0; cut < good.size(); ++cut) EXPECT_THROW(decode_step_order(good.substr(0, cut)), Error) << cut;
  EXPECT_THROW(decode_step_order(good + "x"), Error);
  std::string huge = good;
  huge[13] = '\xff', huge[14] = '\xff', huge[15] = '\xff', huge[16] = '\x7f';  // the chunk count
  EXPECT_THROW(decode_step_order(huge), Error);
  const std::vector<int32_t> none;
  EXPECT_THROW(decode_step_order(encode_step_order({{.tokens = none, .blocks = blocks}}, 1, false, -1)), Error);
}

}  // namespace
}  // namespace tetra::runtime
