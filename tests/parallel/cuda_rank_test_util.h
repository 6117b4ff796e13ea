// What the CUDA communicator tests share: ranks as threads, each with its own stream, on device
// 0 (the test machine has one GPU) or a GPU each, and device tensors filled from and read back
// into host vectors (allocated on the calling thread's device).
#pragma once

#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/communicator.h"
#include "ops/cuda/cuda_check.h"
#include "ops/ops.h"
#include "parallel/rank_threads.h"

namespace tetra::parallel {

// A rank's device, stream and context, as the runtime gives each rank its own.
struct Rank {
  explicit Rank(int d) : device(d) {
    TETRA_CUDA_CHECK(cudaSetDevice(device));
    TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ctx.stream = stream;
    TETRA_CUDA_CHECK(cudaSetDevice(0));
  }
  ~Rank() { cudaStreamDestroy(stream); }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  int device;
  cudaStream_t stream = nullptr;
  ops::Context ctx;
};

// A communicator, a thread and a stream a rank, on devices[rank] (all on device 0 where
// `devices` is empty); a rank that throws aborts every communicator. A rank's work on its
// thread starts with use(rank): the threads start on device 0.
struct RankGroup {
  explicit RankGroup(std::vector<std::unique_ptr<ops::Communicator>> c, std::vector<int> devices = {})
      : comms(std::move(c)), threads(int(comms.size()), [this](const std::string& why) {
          for (auto& comm : comms) comm->abort(why);
        }) {
    for (size_t r = 0; r < comms.size(); ++r) ranks.emplace_back(devices.empty() ? 0 : devices[r]);
  }
  void use(int rank) const { TETRA_CUDA_CHECK(cudaSetDevice(ranks[size_t(rank)].device)); }
  std::vector<std::unique_ptr<ops::Communicator>> comms;
  RankThreads threads;
  std::deque<Rank> ranks;
};

// A device tensor of n elements, uploaded from and read back to host vectors on a rank's stream.
struct DeviceTensor {
  DeviceTensor(DType dt, int64_t n) : dtype(dt), numel(n) {
    TETRA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes(), 1)));
  }
  ~DeviceTensor() { cudaFree(p); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  size_t bytes() const { return size_t(numel) * dtype_bits(dtype) / 8; }
  TensorView view() const { return {p, dtype, {numel}, Device::Cuda}; }
  TensorView view(Shape shape) const { return {p, dtype, shape, Device::Cuda}; }
  template <typename T>
  void put(cudaStream_t s, const std::vector<T>& v) {
    ops::cuda::copy_and_wait(s, p, v.data(), bytes(), cudaMemcpyHostToDevice);
  }
  template <typename T>
  std::vector<T> get(cudaStream_t s) const {
    std::vector<T> v(bytes() / sizeof(T));
    ops::cuda::copy_and_wait(s, v.data(), p, bytes(), cudaMemcpyDeviceToHost);
    return v;
  }
  void* p = nullptr;
  DType dtype;
  int64_t numel;
};

// The host's rank-order sum of F32 values (acc = 0; acc += x_0; acc += x_1; ...).
inline std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& parts) {
  std::vector<float> sum(parts.front().size(), 0.0f);
  for (const auto& p : parts)
    for (size_t i = 0; i < p.size(); ++i) sum[i] += p[i];
  return sum;
}

// Values whose f32 sum depends on the order it is taken in (from the third rank on).
inline float order_sensitive_value(int rank, int64_t i) {
  switch (rank % 3) {
    case 0: return 1e8f + 8.0f * float(i % 5);
    case 1: return -1e8f;
    default: return 1.0f + float(i % 1000) * 1e-3f + float(rank);
  }
}

// For each number of ranks and each length: a group from make_group(n) sums order-sensitive F32
// values, and every rank gets the host's rank-order sum, bit for bit.
template <typename MakeGroup>
void expect_rank_order_sums(MakeGroup make_group, std::initializer_list<int> rank_counts,
                            std::initializer_list<int64_t> lengths) {
  for (int n : rank_counts)
    for (int64_t len : lengths) {
      auto g = make_group(n);
      std::vector<std::vector<float>> host(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < len; ++i) host[size_t(r)].push_back(order_sensitive_value(r, i));
      const std::vector<float> expect = rank_order_sum(host);
      std::vector<std::vector<float>> got(static_cast<size_t>(n));
      g->threads.run([&](int r) {
        g->use(r);
        const cudaStream_t s = g->ranks[size_t(r)].stream;
        DeviceTensor x(DType::F32, len);
        x.put(s, host[size_t(r)]);
        g->comms[size_t(r)]->all_reduce_sum(g->ranks[size_t(r)].ctx, x.view());
        got[size_t(r)] = x.get<float>(s);
      });
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(std::memcmp(got[size_t(r)].data(), expect.data(), expect.size() * 4), 0)
            << n << " ranks, " << len << " elements, rank " << r;
    }
}

}  // namespace tetra::parallel
