// The sum of the CUDA thread communicator's all-reduce (parallel/cuda_thread_communicator.h):
// several ranks' tensors added element by element in rank order, so every rank that runs it
// over the same inputs gets the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace tetra::ops::cuda {

// The most sources one launch adds (they travel by value in the kernel's arguments).
constexpr int kMaxRankSumSources = 8;

// dst[i] = ((0 + sources[0][i]) + sources[1][i]) + ... in f32, for i < n_elements, stored as
// `dtype` (F32, or BF16 rounded once at the end, to nearest even). `sources` is a host array
// of n_sources (1..8) device pointers, each on the stream's device or on one it has peer
// access to; dst may be one of them (each element is read before it is written) if nothing
// else reads that source meanwhile.
// Enqueued on `stream`.
void launch_sum_in_rank_order(cudaStream_t stream, const void* const* sources, int n_sources, DType dtype,
                              int64_t n_elements, void* dst);

}  // namespace tetra::ops::cuda
