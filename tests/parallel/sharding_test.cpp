// What a rank holds: splits on granule boundaries, heads (KV heads replicated past their
// count), and the (tp, ep) pairs tetra runs.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/sharding.h"

namespace tetra::parallel {
namespace {

TEST(Split, EvenPartsCoverTheDimension) {
  EXPECT_EQ(split(96, 2, 0).begin, 0);
  EXPECT_EQ(split(96, 2, 0).end, 48);
  EXPECT_EQ(split(96, 2, 1).begin, 48);
  EXPECT_EQ(split(96, 2, 1).end, 96);
}

TEST(Split, NvfpBlocksAreDealtWholeAndEarlierPartsTakeTheExtra) {
  // 80 = 5 blocks of 16 over 2 ranks: 3 and 2 blocks.
  EXPECT_EQ(split(80, 2, 0, 16).size(), 48);
  EXPECT_EQ(split(80, 2, 1, 16).begin, 48);
  EXPECT_EQ(split(80, 2, 1, 16).end, 80);
  // One block over 2 ranks: the second holds nothing.
  EXPECT_EQ(split(16, 2, 0, 16).size(), 16);
  EXPECT_EQ(split(16, 2, 1, 16).size(), 0);
  EXPECT_EQ(split(16, 2, 1, 16).begin, 16);
  // Uneven plain elements.
  EXPECT_EQ(split(10, 3, 0).size(), 4);
  EXPECT_EQ(split(10, 3, 1).begin, 4);
  EXPECT_EQ(split(10, 3, 2).begin, 7);
  EXPECT_EQ(split(10, 3, 2).end, 10);
  EXPECT_THROW(split(24, 2, 0, 16), Error);  // not a multiple of the granule
}

TEST(SplitHeads, KvHeadsSplitWhenTpDividesThem) {
  const HeadShard s = split_heads(4, 2, {2, 1});
  EXPECT_EQ(s.q_begin, 2);
  EXPECT_EQ(s.n_q, 2);
  EXPECT_EQ(s.kv_begin, 1);
  EXPECT_EQ(s.n_kv, 1);
}

TEST(SplitHeads, MoreRanksThanKvHeadsReplicateTheOneTheirQueriesRead) {
  // 8 query heads, 2 KV heads (groups of 4), tp 4: ranks 0-1 read KV head 0, ranks 2-3 head 1.
  for (int r = 0; r < 4; ++r) {
    const HeadShard s = split_heads(8, 2, {4, r});
    EXPECT_EQ(s.n_q, 2);
    EXPECT_EQ(s.n_kv, 1);
    EXPECT_EQ(s.kv_begin, s.q_begin / 4) << "rank " << r;
  }
  EXPECT_THROW(split_heads(12, 4, {3, 0}), Error);  // 3 neither divides 4 nor is a multiple
  EXPECT_THROW(split_heads(6, 2, {4, 0}), Error);   // heads % tp
}

TEST(Parallelism, EpDividesTpOrTpIsOne) {
  EXPECT_NO_THROW(check_parallelism({2, 2}));
  EXPECT_NO_THROW(check_parallelism({4, 2}));
  EXPECT_NO_THROW(check_parallelism({1, 4}));
  EXPECT_NO_THROW(check_parallelism({4, 1}));
  EXPECT_THROW(check_parallelism({2, 4}), Error);
  EXPECT_THROW(check_parallelism({4, 3}), Error);
}

TEST(RankShard, TheMoeLayerRunsOnEveryRank) {
  // tp 4, ep 2: experts by id in 2 groups of 2 ranks, each expert's width in 2 parts.
  const Parallelism p{4, 2};
  for (int r = 0; r < 4; ++r) {
    const RankShard s{r, p};
    EXPECT_EQ(s.attention().parts, 4);
    EXPECT_EQ(s.attention().index, r);
    EXPECT_EQ(s.expert_ids().parts, 2);
    EXPECT_EQ(s.expert_ids().index, r / 2);
    EXPECT_EQ(s.expert_width().parts, 2);
    EXPECT_EQ(s.expert_width().index, r % 2);
    EXPECT_EQ(s.shared_expert().parts, 4);
  }
  // ep alone: attention whole on each rank.
  const RankShard e{1, {1, 2}};
  EXPECT_TRUE(e.attention().whole());
  EXPECT_EQ(e.expert_ids().index, 1);
  EXPECT_TRUE(e.expert_width().whole());
}

}  // namespace
}  // namespace tetra::parallel
