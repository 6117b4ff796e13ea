// The CUDA peer communicator with every rank on device 0 (the test machine has one GPU): sums
// in rank order with the same bits on every rank, across one launch or several; the sum fused
// with the residual add and RMSNorm leaves the bits the host-synchronised communicator and the
// separate norm leave; collectives captured in a CUDA graph replay correctly; an abort frees a
// rank waiting on the GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/norm.h"
#include "ops/ops.h"
#include "parallel/cuda_peer_communicator.h"
#include "parallel/cuda_thread_communicator.h"
#ifdef TETRA_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif
#include "cuda_rank_test_util.h"

namespace tetra::parallel {
namespace {

struct PeerGroup : RankGroup {
  explicit PeerGroup(int n) : RankGroup(make_cuda_peer_communicators(std::vector<int>(size_t(n), 0))) {}
};

TEST(CudaPeerCommunicator, AllReduceSumsInRankOrderWithTheSameBitsEverywhere) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  // 3 << 20 floats are 12 MiB: two launches through the 8 MiB staging.
  expect_rank_order_sums([](int n) { return std::make_unique<PeerGroup>(n); }, {2, 3, 5},
                         {1, 7, 1001, (1 << 20) + 3, int64_t(3) << 20});
}

TEST(CudaPeerCommunicator, AllReduceOfBf16RoundsTheF32SumOnce) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 3;
  // 4096: 16-byte vectors; 1001: one value at a time; 5 << 20 values are 10 MiB: two launches.
  for (int64_t len : {int64_t(1001), int64_t(4096), int64_t(5) << 20}) {
    PeerGroup g(n);
    std::vector<std::vector<uint16_t>> host(n);
    for (int64_t i = 0; i < len; ++i) {
      host[0].push_back(f32_to_bf16(1.0f + float(i % 4) * 0.0078125f));
      host[1].push_back(f32_to_bf16(0.00390625f));
      host[2].push_back(f32_to_bf16(i % 7 == 0 ? 0.00390625f : 0.001953125f * float(i % 3)));
    }
    std::vector<uint16_t> expect;
    for (int64_t i = 0; i < len; ++i) {
      float acc = 0.0f;
      for (int r = 0; r < n; ++r) acc += bf16_to_f32(host[size_t(r)][size_t(i)]);
      expect.push_back(f32_to_bf16(acc));
    }
    ASSERT_EQ(expect[0], f32_to_bf16(1.0078125f));  // BF16 added one by one would give 1
    std::vector<std::vector<uint16_t>> got(n);
    g.threads.run([&](int r) {
      g.use(r);
      const cudaStream_t s = g.ranks[size_t(r)].stream;
      DeviceTensor x(DType::BF16, len);
      x.put(s, host[size_t(r)]);
      g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x.view());
      got[size_t(r)] = x.get<uint16_t>(s);
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)], expect) << len << " values, rank " << r;
  }
}

// Every rank's h, delta and a shared weight for rows of d, BF16.
struct NormInputs {
  NormInputs(int n, int64_t rows, int64_t d) : delta(size_t(n)) {
    for (int64_t i = 0; i < rows * d; ++i) {
      h.push_back(f32_to_bf16(std::sin(0.37f * float(i)) * 3.0f));
      for (int r = 0; r < n; ++r)
        delta[size_t(r)].push_back(f32_to_bf16(std::cos(0.11f * float(i) + float(r)) * float(r + 1)));
    }
    for (int64_t i = 0; i < d; ++i) weight.push_back(f32_to_bf16(0.5f + float(i % 17) / 16.0f));
  }
  std::vector<uint16_t> h, weight;
  std::vector<std::vector<uint16_t>> delta;
};

struct NormOutputs {
  std::vector<uint16_t> h, out;
};

// Each rank's h and out after the fused step (`fused`), or after the thread communicator's sum
// and norm.cu's add_rms_norm.
std::vector<NormOutputs> add_rms_norm_of_parts(RankGroup& g, const NormInputs& in, int64_t rows, int64_t d,
                                               bool fused) {
  const int n = int(g.comms.size());
  std::vector<NormOutputs> got(static_cast<size_t>(n));
  g.threads.run([&](int r) {
    g.use(r);
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    DeviceTensor h(DType::BF16, rows * d), delta(DType::BF16, rows * d), w(DType::BF16, d), out(DType::BF16, rows * d);
    h.put(s, in.h);
    delta.put(s, in.delta[size_t(r)]);
    w.put(s, in.weight);
    const Shape shape{rows, d};
    const ops::Context& ctx = g.ranks[size_t(r)].ctx;
    if (fused) {
      EXPECT_TRUE(g.comms[size_t(r)]->all_reduce_sum_add_rms_norm(ctx, delta.view(shape), h.view(shape), w.view(),
                                                                  1e-6f, out.view(shape)));
    } else {
      g.comms[size_t(r)]->all_reduce_sum(ctx, delta.view(shape));
      ops::cuda::add_rms_norm({.stream = s}, h.view(shape), delta.view(shape), w.view(), 1e-6f, out.view(shape));
    }
    got[size_t(r)] = {h.get<uint16_t>(s), out.get<uint16_t>(s)};
  });
  return got;
}

TEST(CudaPeerCommunicator, TheSumFusedWithTheNormLeavesTheBitsOfTheTwoApart) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int64_t rows, d;
  };
  // Each of norm.cu's row layouts (512, 2048, 4096 and 7168 values), a ragged row (2,500), and
  // as many rows as there are blocks.
  for (int n : {2, 3})
    for (Case c : {Case{1, 2048}, Case{3, 512}, Case{32, 2500}, Case{17, 4096}, Case{5, 7168}}) {
      const NormInputs in(n, c.rows, c.d);
      PeerGroup peers(n);
      RankGroup threads(make_cuda_thread_communicators(std::vector<int>(size_t(n), 0)));
      const auto fused = add_rms_norm_of_parts(peers, in, c.rows, c.d, true);
      const auto apart = add_rms_norm_of_parts(threads, in, c.rows, c.d, false);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(fused[size_t(r)].h, apart[size_t(r)].h) << n << " ranks, " << c.rows << " x " << c.d << ", rank " << r;
        EXPECT_EQ(fused[size_t(r)].out, apart[size_t(r)].out)
            << n << " ranks, " << c.rows << " x " << c.d << ", rank " << r;
        EXPECT_EQ(fused[size_t(r)].out, fused[0].out) << "rank " << r << " differs from rank 0";
      }
    }
}

TEST(CudaPeerCommunicator, MoreRowsThanBlocksAreLeftToTheSumAndTheNorm) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  PeerGroup g(2);
  const NormInputs in(2, 33, 2048);
  std::atomic<int> fused{0}, changed{0};
  g.threads.run([&](int r) {
    g.use(r);
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    DeviceTensor h(DType::BF16, 33 * 2048), delta(DType::BF16, 33 * 2048), w(DType::BF16, 2048),
        out(DType::BF16, 33 * 2048);
    h.put(s, in.h);
    delta.put(s, in.delta[size_t(r)]);
    fused += g.comms[size_t(r)]->all_reduce_sum_add_rms_norm(g.ranks[size_t(r)].ctx, delta.view({33, 2048}),
                                                             h.view({33, 2048}), w.view(), 1e-6f,
                                                             out.view({33, 2048}));
    changed += h.get<uint16_t>(s) != in.h || delta.get<uint16_t>(s) != in.delta[size_t(r)];
  });
  EXPECT_EQ(fused.load(), 0);
  EXPECT_EQ(changed.load(), 0);
}

TEST(CudaPeerCommunicator, ManyCollectivesOfChangingSizesAndKindsStayInStep) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 3;
  PeerGroup g(n);
  std::atomic<int> wrong{0};
  g.threads.run([&](int r) {
    g.use(r);
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    const ops::Context& ctx = g.ranks[size_t(r)].ctx;
    for (int step = 0; step < 150; ++step) {
      const int64_t size = 1 + (step * 997) % 5000;
      DeviceTensor x(DType::F32, size);
      x.put(s, std::vector<float>(size_t(size), float(r + step)));
      g.comms[size_t(r)]->all_reduce_sum(ctx, x.view());
      for (float v : x.get<float>(s))
        if (v != float(3 * step + 3)) ++wrong;
      if (step % 3 == 0) {  // a gather of the rank's id between sums
        DeviceTensor id(DType::I32, 1 + step % 5), all(DType::I32, n * (1 + step % 5));
        id.put(s, std::vector<int32_t>(size_t(1 + step % 5), r));
        g.comms[size_t(r)]->all_gather(ctx, id.view(), all.view());
        const std::vector<int32_t> got = all.get<int32_t>(s);
        for (size_t i = 0; i < got.size(); ++i)
          if (got[i] != int32_t(i / size_t(1 + step % 5))) ++wrong;
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(CudaPeerCommunicator, CollectivesCapturedInAGraphReplayWithNewInputs) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 2;
  const int64_t rows = 4, d = 1024;
  PeerGroup g(n);
  for (const auto& c : g.comms) EXPECT_TRUE(c->capturable());
  // Each rank's tensors and graph, made before any replays (as the engine captures every rank's
  // graphs before its first step), and uploaded.
  struct Mine {
    Mine() : x(DType::F32, 100), h(DType::BF16, rows * d), delta(DType::BF16, rows * d), w(DType::BF16, d),
             out(DType::BF16, rows * d) {}
    ~Mine() {
      if (exec) cudaGraphExecDestroy(exec);
    }
    DeviceTensor x, h, delta, w, out;
    cudaGraphExec_t exec = nullptr;
  };
  std::vector<std::unique_ptr<Mine>> mine;
  for (int r = 0; r < n; ++r) mine.push_back(std::make_unique<Mine>());
  g.threads.run([&](int r) {
    g.use(r);
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    const ops::Context& ctx = g.ranks[size_t(r)].ctx;
    Mine& m = *mine[size_t(r)];
    m.w.put(s, std::vector<uint16_t>(size_t(d), f32_to_bf16(1.0f)));
    const Shape shape{rows, d};
    cudaGraph_t graph = nullptr;
    TETRA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    g.comms[size_t(r)]->all_reduce_sum(ctx, m.x.view());
    const bool fused = g.comms[size_t(r)]->all_reduce_sum_add_rms_norm(ctx, m.delta.view(shape), m.h.view(shape),
                                                                       m.w.view(), 1e-6f, m.out.view(shape));
    TETRA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    EXPECT_TRUE(fused);
    TETRA_CUDA_CHECK(cudaGraphInstantiate(&m.exec, graph, 0));
    cudaGraphDestroy(graph);
    TETRA_CUDA_CHECK(cudaGraphUpload(m.exec, s));
    TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
  });
  std::atomic<int> wrong{0};
  for (int round = 0; round < 4; ++round) {
    // Small integers: every sum is exact, and out = h / rms(h) = 1 for rows of equal values.
    // The inputs are set on every rank before any replays, so no copy meets a waiting kernel.
    g.threads.run([&](int r) {
      g.use(r);
      const cudaStream_t s = g.ranks[size_t(r)].stream;
      Mine& m = *mine[size_t(r)];
      m.x.put(s, std::vector<float>(100, float(10 * round + r)));
      m.h.put(s, std::vector<uint16_t>(size_t(rows * d), f32_to_bf16(float(round))));
      m.delta.put(s, std::vector<uint16_t>(size_t(rows * d), f32_to_bf16(float(r + 1))));
    });
    g.threads.run([&](int r) {
      g.use(r);
      const cudaStream_t s = g.ranks[size_t(r)].stream;
      Mine& m = *mine[size_t(r)];
      TETRA_CUDA_CHECK(cudaGraphLaunch(m.exec, s));
      TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
    });
    g.threads.run([&](int r) {
      g.use(r);
      const cudaStream_t s = g.ranks[size_t(r)].stream;
      Mine& m = *mine[size_t(r)];
      for (float v : m.x.get<float>(s))
        if (v != float(20 * round + 1)) ++wrong;
      for (uint16_t v : m.h.get<uint16_t>(s))
        if (bf16_to_f32(v) != float(round + 3)) ++wrong;
      for (uint16_t v : m.out.get<uint16_t>(s))
        if (std::fabs(bf16_to_f32(v) - 1.0f) > 1e-2f) ++wrong;
    });
  }
  EXPECT_EQ(wrong.load(), 0);
}

TEST(CudaPeerCommunicator, AnAbortFreesARankWaitingOnTheGpu) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  PeerGroup g(2);
  DeviceTensor x(DType::F32, 64);
  const cudaStream_t s = g.ranks[0].stream;
  // Outside a graph rank 0 would wait for rank 1 on the host; a graph's kernel waits on the GPU.
  cudaGraph_t graph = nullptr;
  TETRA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  g.comms[0]->all_reduce_sum(g.ranks[0].ctx, x.view());
  TETRA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  TETRA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TETRA_CUDA_CHECK(cudaGraphLaunch(exec, s));  // rank 1 never comes: it spins until the abort
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  std::thread rank1([&] { g.comms[1]->abort("rank 1 is gone"); });
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  rank1.join();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  try {
    g.comms[0]->all_reduce_sum(g.ranks[0].ctx, x.view());
    FAIL() << "a collective after the abort returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 is gone"), std::string::npos) << e.what();
  }
}

TEST(CudaPeerCommunicator, ARankThatThrowsAbortsTheOthersCollectives) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 3;
  PeerGroup g(n);
  std::vector<std::unique_ptr<DeviceTensor>> x;
  for (int r = 0; r < n; ++r) x.push_back(std::make_unique<DeviceTensor>(DType::F32, 8));
  try {
    g.threads.run([&](int r) {
      g.use(r);
      if (r == 1) fail("rank one broke");
      g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x[size_t(r)]->view());  // waits for rank 1
    });
    FAIL() << "run returned normally";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank one broke");
  }
  EXPECT_THROW(g.comms[0]->all_reduce_sum(g.ranks[0].ctx, x[0]->view()), Error);
}

TEST(CudaPeerCommunicator, LargeMessagesGoToTheLargeCommunicator) {
  if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  const int n = 2;
  RankGroup g(make_cuda_peer_communicators({0, 0}, make_cuda_thread_communicators({0, 0})));
  for (const auto& c : g.comms) EXPECT_FALSE(c->capturable());  // the thread communicator is not
  const int64_t big = int64_t(3) << 20, rows = 16, d = 2048;      // 12 MiB
  std::vector<std::vector<float>> host(n);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < big; ++i) host[size_t(r)].push_back(float(i % 1000) + float(r));
  const std::vector<float> expect = rank_order_sum(host);
  std::atomic<int> wrong{0}, fused{0};
  g.threads.run([&](int r) {
    g.use(r);
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    DeviceTensor x(DType::F32, big), t(DType::BF16, rows * d), w(DType::BF16, d);
    x.put(s, host[size_t(r)]);
    g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x.view());
    if (x.get<float>(s) != expect) ++wrong;
    // A few rows go through peer memory, fused, whatever the large communicator.
    DeviceTensor h(DType::BF16, rows * d), out(DType::BF16, rows * d);
    fused += g.comms[size_t(r)]->all_reduce_sum_add_rms_norm(g.ranks[size_t(r)].ctx, t.view({rows, d}),
                                                             h.view({rows, d}), w.view(), 1e-6f, out.view({rows, d}));
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(fused.load(), n);
}

// Ranks on GPUs of their own, where the machine has two: the sums, and the fused step against the
// thread communicator's sum and the separate norm, as on one GPU; NCCL taking the large messages.
class CudaPeerCommunicatorOnTwoGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ops::cuda_device_count() < 2) GTEST_SKIP() << "fewer than two GPUs";
  }
  static std::unique_ptr<RankGroup> peers(std::vector<std::unique_ptr<ops::Communicator>> large = {}) {
    return std::make_unique<RankGroup>(make_cuda_peer_communicators({0, 1}, std::move(large)), std::vector<int>{0, 1});
  }
};

TEST_F(CudaPeerCommunicatorOnTwoGpus, SumsInRankOrder) {
  expect_rank_order_sums([](int) { return peers(); }, {2}, {1, 1001, (1 << 20) + 3, int64_t(3) << 20});
}

TEST_F(CudaPeerCommunicatorOnTwoGpus, TheSumFusedWithTheNormLeavesTheBitsOfTheTwoApart) {
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{1, 2048}, {32, 6144}}) {
    const NormInputs in(2, rows, d);
    auto fused_group = peers();
    RankGroup apart_group(make_cuda_thread_communicators({0, 1}), {0, 1});
    const auto fused = add_rms_norm_of_parts(*fused_group, in, rows, d, true);
    const auto apart = add_rms_norm_of_parts(apart_group, in, rows, d, false);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(fused[size_t(r)].h, apart[size_t(r)].h) << rows << " x " << d << ", rank " << r;
      EXPECT_EQ(fused[size_t(r)].out, apart[size_t(r)].out) << rows << " x " << d << ", rank " << r;
    }
  }
}

#ifdef TETRA_HAVE_NCCL
// Two ranks' sum is the same bits in any order, so NCCL's ring leaves the rank-order sum too.
TEST_F(CudaPeerCommunicatorOnTwoGpus, NcclTakesTheLargeMessages) {
  std::string why_not;
  if (!nccl_loads(&why_not)) GTEST_SKIP() << "NCCL does not load here: " << why_not;
  expect_rank_order_sums([](int) { return peers(make_nccl_communicators({0, 1})); }, {2},
                         {1001, int64_t(3) << 20});
}
#endif

}  // namespace
}  // namespace tetra::parallel
