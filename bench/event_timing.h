// GPU time of benchmark runs, measured with CUDA events: each run between two events on the
// stream, after whatever warm-up the caller did.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/cuda_check.h"

namespace tetra::bench {

// The microseconds of `iters` runs, in run order; run i is what enqueue(i) puts on `stream`.
template <typename Enqueue>
std::vector<double> time_runs_us(cudaStream_t stream, int iters, Enqueue&& enqueue) {
  struct Events {
    std::vector<cudaEvent_t> ev;
    ~Events() {
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
    }
  } events{std::vector<cudaEvent_t>(size_t(2 * iters), nullptr)};
  for (auto& e : events.ev) TETRA_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    TETRA_CUDA_CHECK(cudaEventRecord(events.ev[size_t(2 * i)], stream));
    enqueue(i);
    TETRA_CUDA_CHECK(cudaEventRecord(events.ev[size_t(2 * i + 1)], stream));
  }
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    TETRA_CUDA_CHECK(cudaEventElapsedTime(&ms, events.ev[size_t(2 * i)], events.ev[size_t(2 * i + 1)]));
    us.push_back(double(ms) * 1e3);
  }
  return us;
}

}  // namespace tetra::bench
