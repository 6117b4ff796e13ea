// The GPU's read ceiling, measured in the benchmark's own run: how fast one kernel can stream
// a buffer much larger than L2 with the loads the MoE kernels use. A floor is only as good as
// the bandwidth it divides by; this says what this GPU, at this moment, actually reads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tetra::bench {

struct ReadCeiling {
  int64_t bytes = 0;  // read per run
  double median_tbps = 0, min_tbps = 0, max_tbps = 0;
};

// Reads `bytes` (a multiple of 16, at least 64 MiB) `iters` times, each run between two events
// on `stream`, after two warm-up runs; allocates and frees its own buffer.
ReadCeiling measure_read_ceiling(cudaStream_t stream, int sm_count, int64_t bytes, int iters);

}  // namespace tetra::bench
