// Backend::sample on CUDA (sm_90a): the sampling rule of ops/cpu/sampling.h for a batch of rows
// in one kernel launch, with the CPU reference's arithmetic, so both pick the same token bit
// for bit. No allocation, no host synchronization: the launch can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

// The largest vocabulary launch_sample takes (its tile table lives in shared memory).
inline constexpr int64_t kSampleMaxVocab = int64_t(1) << 20;

// Bytes of device workspace launch_sample needs for n_rows rows of vocab logits: a private
// copy of the row for each block that may hold a penalized row (blocks stride over the rows).
int64_t sample_workspace_bytes(int64_t n_rows, int64_t vocab);

// One token per row of logits F32 [n_rows, vocab] under rows[r], into out[r]. penalty_ids /
// penalty_counts [n_penalties] hold each row's distinct penalized ids and their counts in the
// output (0: a prompt token only) at [penalty_begin, penalty_begin + penalty_count). rows, the
// penalty lists, out and workspace (at least sample_workspace_bytes) are device pointers. Row
// fields cannot be checked from the host; the kernel clamps them to memory-safe ranges (the CPU
// backend rejects what it clamps). Throws tetra::Error on a bad size or a launch failure.
void launch_sample(const KernelLaunch& launch, const float* logits, int64_t n_rows, int64_t vocab,
                   const SamplingRow* rows, const int32_t* penalty_ids, const int32_t* penalty_counts,
                   int64_t n_penalties, SampledToken* out, void* workspace);

}  // namespace tetra::ops::cuda
