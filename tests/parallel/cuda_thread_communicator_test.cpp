// The CUDA thread communicator with every rank on device 0 (the test machine has one GPU): sums
// in rank order with the same bits on every rank (BF16 rounded once), gathers in rank order, a
// failed rank or mismatched tensors never leave a rank waiting, and a stream under capture is
// refused.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/ops.h"
#include "parallel/cuda_thread_communicator.h"
#include "parallel/rank_threads.h"
#include "cuda_rank_test_util.h"

namespace tetra::parallel {
namespace {

// Every rank of a group of n on device 0.
struct Group : RankGroup {
  explicit Group(int n) : RankGroup(make_cuda_thread_communicators(std::vector<int>(size_t(n), 0))) {}
};

TEST(CudaThreadCommunicator, AllReduceSumsInRankOrderWithTheSameBitsEverywhere) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  expect_rank_order_sums([](int n) { return std::make_unique<Group>(n); }, {2, 3}, {1001, (1 << 20) + 3});
}

TEST(CudaThreadCommunicator, AllReduceOfBf16RoundsTheF32SumOnce) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 3;
  const int64_t len = 1001;
  Group g(n);
  // 1 + 2^-8 + 2^-8 is 1 + 2^-7 in f32, a BF16 value; added in BF16 one by one it stays 1
  // (each 2^-8 is half a BF16 step, a tie that rounds to even). The other elements need rounding.
  std::vector<std::vector<uint16_t>> host(n);
  for (int64_t i = 0; i < len; ++i) {
    host[0].push_back(f32_to_bf16(1.0f + float(i % 4) * 0.0078125f));
    host[1].push_back(f32_to_bf16(0.00390625f));
    host[2].push_back(f32_to_bf16(i == 0 ? 0.00390625f : 0.001953125f * float(i % 3)));
  }
  std::vector<uint16_t> expect;
  for (int64_t i = 0; i < len; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < n; ++r) acc += bf16_to_f32(host[size_t(r)][size_t(i)]);
    expect.push_back(f32_to_bf16(acc));
  }
  ASSERT_EQ(expect[0], f32_to_bf16(1.0078125f));
  std::vector<std::vector<uint16_t>> got(n);
  g.threads.run([&](int r) {
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    DeviceTensor x(DType::BF16, len);
    x.put(s, host[size_t(r)]);
    g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x.view());
    got[size_t(r)] = x.get<uint16_t>(s);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)], expect) << "rank " << r;
}

TEST(CudaThreadCommunicator, ManyCollectivesOfChangingSizesStayInStep) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 3;
  Group g(n);
  std::atomic<int> wrong{0};
  g.threads.run([&](int r) {
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    for (int step = 0; step < 200; ++step) {
      const int64_t size = 1 + (step * 997) % 5000;  // the scratch grows now and then
      DeviceTensor x(DType::F32, size);
      x.put(s, std::vector<float>(size_t(size), float(r + step)));
      g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x.view());
      for (float v : x.get<float>(s))
        if (v != float(3 * step + 3)) ++wrong;
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(CudaThreadCommunicator, AllGatherConcatenatesInRankOrder) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 3;
  const int64_t len = 7;
  Group g(n);
  std::vector<std::vector<int32_t>> got(n);
  g.threads.run([&](int r) {
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    DeviceTensor x(DType::I32, len), out(DType::I32, n * len);
    std::vector<int32_t> mine;
    for (int64_t i = 0; i < len; ++i) mine.push_back(int32_t(100 * r + i));
    x.put(s, mine);
    g.comms[size_t(r)]->all_gather(g.ranks[size_t(r)].ctx, x.view(), out.view());
    got[size_t(r)] = out.get<int32_t>(s);
  });
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < len; ++i)
        EXPECT_EQ(got[size_t(r)][size_t(q * len + i)], 100 * q + i) << "rank " << r;
}

TEST(CudaThreadCommunicator, MismatchedShapesFailEveryRank) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  Group g(2);
  std::atomic<int> threw{0};
  EXPECT_THROW(g.threads.run([&](int r) {
    DeviceTensor x(DType::F32, 4 + r);
    try {
      g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x.view());
    } catch (const Error&) {
      ++threw;
      throw;
    }
  }),
               Error);
  EXPECT_EQ(threw.load(), 2);
}

TEST(CudaThreadCommunicator, ARankThatThrowsAbortsTheOthersCollectives) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 3;
  Group g(n);
  std::vector<std::unique_ptr<DeviceTensor>> x;
  for (int r = 0; r < n; ++r) x.push_back(std::make_unique<DeviceTensor>(DType::F32, 8));
  std::atomic<int> echoed{0};
  try {
    g.threads.run([&](int r) {
      if (r == 1) fail("rank one broke");
      try {
        g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x[size_t(r)]->view());  // waits for rank 1
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
  EXPECT_THROW(g.threads.run([&](int r) {
    g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x[size_t(r)]->view());
  }),
               Error);
}

TEST(CudaThreadCommunicator, RefusesAStreamUnderCaptureAndOtherDtypes) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  // One rank: its barrier would return at once, so only the capture check can refuse.
  auto comms = make_cuda_thread_communicators({0});
  Rank rank(0);
  DeviceTensor x(DType::F32, 16), ints(DType::I32, 16);
  ASSERT_EQ(cudaStreamBeginCapture(rank.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::string what;
  try {
    comms[0]->all_reduce_sum(rank.ctx, x.view());
  } catch (const Error& e) {
    what = e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(rank.stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  EXPECT_NE(what.find("CUDA graph capture"), std::string::npos) << what;
  EXPECT_THROW(comms[0]->all_reduce_sum(rank.ctx, ints.view()), Error);
  // Outside a capture the one rank's sum is its own tensor.
  x.put(rank.stream, std::vector<float>(16, 2.5f));
  comms[0]->all_reduce_sum(rank.ctx, x.view());
  EXPECT_EQ(x.get<float>(rank.stream), std::vector<float>(16, 2.5f));
}

}  // namespace
}  // namespace tetra::parallel
