// What the GPU benchmarks share: device buffers, CUDA-graph capture, and graph replays timed
// with events (the protocol of docs/PERF.md: warm-up, then median, min and max of the runs).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "bench/event_timing.h"
#include "ops/cuda/cuda_check.h"

namespace tetra::bench {

struct Stats {
  double median_us = 0, min_us = 0, max_us = 0;
};

// A device allocation that frees itself.
struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t bytes) { TETRA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

// A non-blocking stream that destroys itself.
struct BenchStream {
  cudaStream_t s = nullptr;
  BenchStream() { TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~BenchStream() { cudaStreamDestroy(s); }
  BenchStream(const BenchStream&) = delete;
  BenchStream& operator=(const BenchStream&) = delete;
};

// Host -> device on the benchmark's stream, complete on return (ops/cuda/cuda_check.h).
inline void upload(cudaStream_t stream, void* dst, const void* src, size_t bytes) {
  ops::cuda::copy_and_wait(stream, dst, src, bytes, cudaMemcpyHostToDevice);
}

struct Graph {
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

// Captures what `enqueue` puts on the stream into an executable graph.
template <typename F>
std::unique_ptr<Graph> capture(cudaStream_t stream, F&& enqueue) {
  TETRA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t g;
    cudaStreamEndCapture(stream, &g);
    throw;
  }
  cudaGraph_t g;
  TETRA_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  auto out = std::make_unique<Graph>();
  TETRA_CUDA_CHECK(cudaGraphInstantiate(&out->exec, g, 0));
  TETRA_CUDA_CHECK(cudaGraphDestroy(g));
  // Uploaded now, not by its first launch, as the backend's graphs are (ops/cuda/cuda_backend.cpp):
  // `bench collective` launches ranks' graphs that wait for each other.
  TETRA_CUDA_CHECK(cudaGraphUpload(out->exec, stream));
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

// Replays graph i % n for run i, each between two events; two warm-up rounds first.
inline Stats time_graphs(cudaStream_t stream, const std::vector<std::unique_ptr<Graph>>& graphs, int iters) {
  for (int w = 0; w < 2; ++w)
    for (const auto& g : graphs) TETRA_CUDA_CHECK(cudaGraphLaunch(g->exec, stream));
  std::vector<double> us = time_runs_us(stream, iters, [&](int i) {
    TETRA_CUDA_CHECK(cudaGraphLaunch(graphs[size_t(i) % graphs.size()]->exec, stream));
  });
  std::sort(us.begin(), us.end());
  return Stats{us[us.size() / 2], us.front(), us.back()};
}

}  // namespace tetra::bench
