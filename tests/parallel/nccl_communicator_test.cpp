// The NCCL communicator with one rank on GPU 0 (NCCL refuses two ranks on one GPU): libnccl loads
// at run time, a one-rank sum and gather leave the data as it was, tensors it cannot take are
// refused, and an aborted communicator throws; and two ranks on two GPUs where there are two.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/ops.h"
#include "parallel/nccl_communicator.h"
#include "cuda_rank_test_util.h"

// Built where nccl.h is (TETRA_HAVE_NCCL, as the communicator is).
#ifdef TETRA_HAVE_NCCL
namespace tetra::parallel {
namespace {

struct DeviceVector {
  explicit DeviceVector(size_t bytes) : bytes(bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceVector() { cudaFree(p); }
  void* p = nullptr;
  size_t bytes;
};

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ops::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    std::string why_not, which;
    // The GPU machine's scripts/gpu names its libnccl in TETRA_NCCL_LIBRARY; say plainly where
    // there is none.
    if (!nccl_loads(&why_not, &which)) GTEST_SKIP() << "NCCL does not load here: " << why_not;
    std::printf("  %s\n", which.c_str());
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ctx.stream = stream;
  }
  void TearDown() override {
    if (stream) cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
  ops::Context ctx;
};

TEST_F(NcclCommunicatorTest, OneRankSumsAndGathersToItself) {
  auto comms = make_nccl_communicators({0});
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(comms[0]->rank(), 0);
  EXPECT_EQ(comms[0]->size(), 1);
  std::vector<float> host(1001);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i) * 0.37f - 100.0f;
  DeviceVector x(host.size() * 4), out(host.size() * 4);
  ASSERT_EQ(cudaMemcpy(x.p, host.data(), x.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  comms[0]->all_reduce_sum(ctx, {x.p, DType::F32, {int64_t(host.size())}, Device::Cuda});
  comms[0]->all_gather(ctx, {x.p, DType::F32, {int64_t(host.size())}, Device::Cuda},
                       {out.p, DType::F32, {int64_t(host.size())}, Device::Cuda});
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> summed(host.size()), gathered(host.size());
  ASSERT_EQ(cudaMemcpy(summed.data(), x.p, x.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gathered.data(), out.p, out.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(summed.data(), host.data(), x.bytes), 0);
  EXPECT_EQ(std::memcmp(gathered.data(), host.data(), x.bytes), 0);
}

TEST_F(NcclCommunicatorTest, RefusesWhatItCannotTakeAndThrowsOnceAborted) {
  auto comms = make_nccl_communicators({0});
  DeviceVector x(64);
  // I32 is not summed; a gather's out must hold size x n elements.
  EXPECT_THROW(comms[0]->all_reduce_sum(ctx, {x.p, DType::I32, {16}, Device::Cuda}), Error);
  EXPECT_THROW(comms[0]->all_gather(ctx, {x.p, DType::F32, {8}, Device::Cuda}, {x.p, DType::F32, {4}, Device::Cuda}),
               Error);
  comms[0]->abort("rank 0 failed: a test");
  try {
    comms[0]->all_reduce_sum(ctx, {x.p, DType::F32, {16}, Device::Cuda});
    FAIL() << "a collective after abort must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 failed: a test"), std::string::npos) << e.what();
  }
}

// Two ranks on GPUs of their own, where the machine has them: each thread sums and gathers on
// its comm, and both get the same bits (two ranks' sum is the same in any order).
TEST_F(NcclCommunicatorTest, TwoRanksOnGpusOfTheirOwnSumAndGather) {
  if (ops::cuda_device_count() < 2) GTEST_SKIP() << "fewer than two GPUs";
  RankGroup g(make_nccl_communicators({0, 1}), {0, 1});
  std::vector<std::vector<float>> host(2);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 1001; ++i) host[size_t(r)].push_back(order_sensitive_value(r, i));
  const std::vector<float> sum = rank_order_sum(host);
  std::vector<std::vector<float>> summed(2), gathered(2);
  g.threads.run([&](int r) {
    g.use(r);
    const cudaStream_t s = g.ranks[size_t(r)].stream;
    DeviceTensor x(DType::F32, 1001), all(DType::F32, 2 * 1001);
    x.put(s, host[size_t(r)]);
    g.comms[size_t(r)]->all_gather(g.ranks[size_t(r)].ctx, x.view(), all.view());
    g.comms[size_t(r)]->all_reduce_sum(g.ranks[size_t(r)].ctx, x.view());
    summed[size_t(r)] = x.get<float>(s);
    gathered[size_t(r)] = all.get<float>(s);
  });
  std::vector<float> both = host[0];
  both.insert(both.end(), host[1].begin(), host[1].end());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(std::memcmp(summed[size_t(r)].data(), sum.data(), sum.size() * 4), 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(gathered[size_t(r)].data(), both.data(), both.size() * 4), 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace tetra::parallel
#endif  // TETRA_HAVE_NCCL
