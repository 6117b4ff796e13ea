// The block manager alone: reference counts, all-or-nothing allocation, LRU reuse of cached
// prefixes, and prefix hits that a hash collision can never fake.
#include <gtest/gtest.h>

#include <numeric>

#include "runtime/block_manager.h"

namespace tetra::runtime {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Allocates blocks for `tokens`, marks them computed and releases them, leaving them cached.
void cache_sequence(BlockManager& bm, const std::vector<int32_t>& tokens) {
  BlockTable t;
  ASSERT_TRUE(bm.allocate(bm.blocks_for(int64_t(tokens.size())), t));
  bm.register_blocks(tokens, t);
  bm.release(t);
}

TEST(SipHash, ReferenceVector) {
  // The SipHash paper's test vector: key 00..0f, message 00..0e.
  uint8_t msg[15];
  for (int i = 0; i < 15; ++i) msg[i] = uint8_t(i);
  EXPECT_EQ(siphash24(0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull, msg, 15), 0xa129ca6149be45e5ull);
}

TEST(BlockManager, AllocationIsAllOrNothing) {
  BlockManager bm(4, 4, true);
  BlockTable a, b;
  ASSERT_TRUE(bm.allocate(3, a));
  EXPECT_EQ(bm.n_free(), 1);
  EXPECT_FALSE(bm.allocate(2, b));
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(bm.n_free(), 1);
  bm.release(a);
  EXPECT_EQ(bm.n_free(), 4);
  EXPECT_TRUE(a.blocks.empty());
}

TEST(BlockManager, CachedPrefixIsSharedAndOutlivesItsSequence) {
  BlockManager bm(8, 4, true);
  const auto tokens = iota_tokens(10, 100);  // 2 full blocks and a partial one
  BlockTable first;
  ASSERT_TRUE(bm.allocate(3, first));
  bm.register_blocks(tokens, first);
  EXPECT_EQ(first.n_hashed, 2);  // the partial block is never cached
  EXPECT_EQ(bm.n_cached(), 2);

  // Shared while the first sequence still runs: same blocks, more references.
  BlockTable second;
  EXPECT_EQ(bm.match_prefix(tokens, 2, second), 2);
  EXPECT_EQ(second.blocks, std::vector<int32_t>(first.blocks.begin(), first.blocks.begin() + 2));
  bm.release(first);
  EXPECT_EQ(bm.n_free(), 6);  // the partial block is back; the shared two are still held
  bm.release(second);
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_EQ(bm.n_cached(), 2);  // free but still reusable

  BlockTable third;
  EXPECT_EQ(bm.match_prefix(tokens, 5, third), 2);
  bm.release(third);
  // A prompt that differs in its second block matches only the first.
  auto other = tokens;
  other[5] = 7;
  BlockTable fourth;
  EXPECT_EQ(bm.match_prefix(other, 2, fourth), 1);
  bm.release(fourth);
}

TEST(BlockManager, EvictsLeastRecentlyUsedCachedBlocksLast) {
  BlockManager bm(4, 2, true);
  const auto a = iota_tokens(4, 0), b = iota_tokens(4, 50);
  cache_sequence(bm, a);
  cache_sequence(bm, b);
  EXPECT_EQ(bm.n_cached(), 4);
  BlockTable touch;  // a is now more recent than b
  EXPECT_EQ(bm.match_prefix(a, 2, touch), 2);
  bm.release(touch);
  BlockTable fresh;
  ASSERT_TRUE(bm.allocate(2, fresh));  // evicts b's blocks
  BlockTable probe;
  EXPECT_EQ(bm.match_prefix(b, 2, probe), 0);
  EXPECT_EQ(bm.match_prefix(a, 2, probe), 2);
  bm.release(probe);
  bm.release(fresh);
  EXPECT_EQ(bm.n_free(), 4);
}

TEST(BlockManager, ForcedCollisionsNeverServeOtherTokens) {
  // Every block hashes alike: only the stored token ids and parent links can tell them apart.
  BlockManager bm(16, 4, true);
  bm.set_hash_for_testing([](uint64_t, std::span<const int32_t>) { return uint64_t(7); });
  const auto a = iota_tokens(8, 0), b = iota_tokens(8, 300);
  cache_sequence(bm, a);
  BlockTable t;
  EXPECT_EQ(bm.match_prefix(b, 2, t), 0);
  EXPECT_TRUE(t.blocks.empty());
}

TEST(BlockManager, HitNeedsTheSameParentBlock) {
  // A hash that ignores the parent: X = [p, c] and Y = [q, c] give c the same hash, and the
  // table ends up pointing at Y's copy of c. Z = [p, c] must not take Y's c (its K/V were
  // computed after q, not p).
  BlockManager bm(16, 2, true);
  bm.set_hash_for_testing([](uint64_t, std::span<const int32_t> t) {
    return uint64_t(uint32_t(t[0])) * 1000003u + uint32_t(t[1]);
  });
  const std::vector<int32_t> x = {1, 2, 9, 9}, y = {3, 4, 9, 9};
  BlockTable tx, ty;
  ASSERT_TRUE(bm.allocate(2, tx));
  bm.register_blocks(x, tx);
  ASSERT_TRUE(bm.allocate(2, ty));
  bm.register_blocks(y, ty);
  BlockTable tz;
  EXPECT_EQ(bm.match_prefix(x, 2, tz), 1);
  EXPECT_EQ(tz.blocks[0], tx.blocks[0]);
  bm.release(tz);
  bm.release(tx);
  bm.release(ty);
}

TEST(BlockManager, EvictedBlocksStopMatching) {
  BlockManager bm(3, 2, true);
  const std::vector<int32_t> a = {1, 2, 3, 4};
  cache_sequence(bm, a);  // blocks hold [1,2] and [3,4], both free and cached
  BlockTable t;
  ASSERT_TRUE(bm.allocate(2, t));  // one never-used block, then evicts the LRU one ([3,4])
  bm.release(t);
  BlockTable probe;
  EXPECT_EQ(bm.match_prefix(a, 2, probe), 1);
  bm.release(probe);
}

TEST(BlockManager, NoCachingWhenDisabled) {
  BlockManager bm(4, 2, false);
  const auto a = iota_tokens(4, 0);
  cache_sequence(bm, a);
  BlockTable t;
  EXPECT_EQ(bm.match_prefix(a, 2, t), 0);
  EXPECT_EQ(bm.n_cached(), 0);
}

}  // namespace
}  // namespace tetra::runtime
