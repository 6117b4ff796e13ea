#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

namespace tetra {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 4, 5, 1000, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1) << n << " " << i;
  }
}

TEST(ThreadPool, ManyRoundsInARow) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int r = 0; r < 200; ++r)
    pool.parallel_for(100, 10, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum, 200 * 100);
}

TEST(ThreadPool, ExceptionsReachTheCallerAfterEveryChunk) {
  ThreadPool pool(4);
  for (int64_t thrower : {0, 999}) {  // the calling thread's chunk, then a worker's
    std::atomic<int> finished{0};
    EXPECT_THROW(pool.parallel_for(1000, 1,
                                   [&](int64_t b, int64_t e) {
                                     if (b <= thrower && thrower < e) throw std::runtime_error("bad row");
                                     ++finished;
                                   }),
                 std::runtime_error);
    EXPECT_EQ(finished, 3);  // the other chunks ran to their end before the throw arrived
  }
  // The pool serves the next job as before.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 10, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum, 100);
}

}  // namespace
}  // namespace tetra
