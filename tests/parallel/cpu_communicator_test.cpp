// The CPU communicator: sums in rank order with the same bits on every rank, gathers in rank
// order, and a failed rank never leaves the others waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/ops.h"
#include "parallel/cpu_communicator.h"
#include "parallel/rank_threads.h"

namespace tetra::parallel {
namespace {

TensorView view(std::vector<float>& v) { return {v.data(), DType::F32, {int64_t(v.size())}, Device::Cpu}; }

struct Group {
  explicit Group(int n)
      : comms(make_cpu_communicators(n)), threads(n, [this](const std::string& why) {
          for (auto& c : comms) c->abort(why);
        }) {}
  std::vector<std::unique_ptr<ops::Communicator>> comms;
  RankThreads threads;
  ops::Context ctx;
};

TEST(CpuCommunicator, AllReduceSumsInRankOrderWithTheSameBitsEverywhere) {
  const int n = 3;
  Group g(n);
  // Values whose sum depends on the order it is taken in.
  std::vector<std::vector<float>> x(n);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 1001; ++i) x[size_t(r)].push_back(r == 1 ? -1e8f : (r == 0 ? 1e8f : 1.0f + float(i) * 1e-3f));
  std::vector<float> expect(1001);
  for (int i = 0; i < 1001; ++i) expect[size_t(i)] = (x[0][size_t(i)] + x[1][size_t(i)]) + x[2][size_t(i)];
  g.threads.run([&](int r) { g.comms[size_t(r)]->all_reduce_sum(g.ctx, view(x[size_t(r)])); });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(std::memcmp(x[size_t(r)].data(), expect.data(), expect.size() * 4), 0) << "rank " << r;
}

TEST(CpuCommunicator, AllReduceOfBf16RoundsTheF32SumOnce) {
  Group g(2);
  std::vector<std::vector<uint16_t>> x(2, std::vector<uint16_t>(5));
  for (int i = 0; i < 5; ++i) {
    x[0][size_t(i)] = f32_to_bf16(1.0f + float(i));
    x[1][size_t(i)] = f32_to_bf16(0.00390625f);  // 2^-8: lost when added in BF16 one by one
  }
  g.threads.run([&](int r) {
    g.comms[size_t(r)]->all_reduce_sum(g.ctx, {x[size_t(r)].data(), DType::BF16, {5}, Device::Cpu});
  });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(x[0][size_t(i)], f32_to_bf16(1.0f + float(i) + 0.00390625f));
    EXPECT_EQ(x[1][size_t(i)], x[0][size_t(i)]);
  }
}

TEST(CpuCommunicator, AllGatherConcatenatesInRankOrder) {
  const int n = 4;
  Group g(n);
  std::vector<std::vector<float>> x(n), out(n, std::vector<float>(size_t(3 * n)));
  for (int r = 0; r < n; ++r) x[size_t(r)] = {float(r), float(r) + 0.5f, float(r) + 0.25f};
  g.threads.run([&](int r) { g.comms[size_t(r)]->all_gather(g.ctx, view(x[size_t(r)]), view(out[size_t(r)])); });
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) EXPECT_EQ(out[size_t(r)][size_t(3 * q + 1)], float(q) + 0.5f);
}

TEST(CpuCommunicator, ManyCollectivesOfChangingSizesStayInStep) {
  const int n = 3;
  Group g(n);
  std::vector<std::vector<float>> x(n);
  std::atomic<int> wrong{0};
  g.threads.run([&](int r) {
    for (int step = 0; step < 500; ++step) {
      const int size = 1 + step % 37;
      x[size_t(r)].assign(size_t(size), float(r + step));
      g.comms[size_t(r)]->all_reduce_sum(g.ctx, view(x[size_t(r)]));
      for (float v : x[size_t(r)])
        if (v != float(3 * step + 3)) ++wrong;
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(CpuCommunicator, ARankThatThrowsAbortsTheOthersCollectives) {
  const int n = 3;
  Group g(n);
  std::vector<std::vector<float>> x(n, std::vector<float>(8, 1.0f));
  std::atomic<int> echoed{0};
  try {
    g.threads.run([&](int r) {
      if (r == 1) fail("rank one broke");
      try {
        g.comms[size_t(r)]->all_reduce_sum(g.ctx, view(x[size_t(r)]));  // waits for rank 1
      } catch (const Error& e) {
        if (std::string(e.what()).find("rank 1 failed: rank one broke") != std::string::npos) ++echoed;
        throw;
      }
    });
    FAIL() << "run returned normally";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank one broke");  // the cause, not an echo
  }
  EXPECT_EQ(echoed.load(), 2);
  // The group stays aborted: a later collective throws at once instead of waiting.
  EXPECT_THROW(g.threads.run([&](int r) { g.comms[size_t(r)]->all_reduce_sum(g.ctx, view(x[size_t(r)])); }), Error);
}

TEST(CpuCommunicator, MismatchedShapesFailEveryRank) {
  Group g(2);
  std::vector<std::vector<float>> x{std::vector<float>(4), std::vector<float>(5)};
  EXPECT_THROW(g.threads.run([&](int r) { g.comms[size_t(r)]->all_reduce_sum(g.ctx, view(x[size_t(r)])); }), Error);
}

}  // namespace
}  // namespace tetra::parallel
