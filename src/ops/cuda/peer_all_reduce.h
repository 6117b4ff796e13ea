// One-shot collectives over peer memory, for ranks that are threads of one process on one GPU
// or on GPUs that can read each other's memory (parallel/cuda_peer_communicator.h owns the
// buffers). Each rank copies its part into its own staging buffer, raises a flag in every other
// rank's memory, waits for theirs, and reads every rank's part straight from where it lies.
// Nothing waits on the host, and a launch's arguments never change: the flags count launches
// in device memory, so these run inside CUDA graphs and replay correctly.
//
// The protocol, per launch:
//   - every launch of a group has kPeerBlocks blocks, and block b of every rank takes the same
//     slice of the work: it only ever meets block b of the other ranks, through the flags
//     flag[b][*]; no block waits for another block of its own grid;
//   - a block's epoch (the launches it has seen, in device memory) picks the staging half,
//     epoch % 2. A rank writes half e % 2 only after its launch e - 1 has seen every other
//     rank's flag e - 1, which those ranks raised after their launch e - 2, the last to read
//     that half, had completed: so two halves are enough, without a barrier at the end;
//   - a wait also watches the group's abort word (host memory mapped into the GPU): a rank that
//     failed never leaves the others spinning. What an aborted launch writes is garbage, and
//     the communicator refuses every later collective.
// Every rank must make the same launches with the same sizes, in the same order, as with any
// collective; the sizes are not checked across ranks (that would need a host round trip), but
// no read leaves a staging half whatever the other ranks pass.
#pragma once

#include <cstdint>

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

// Loads every kernel here on the current device. With CUDA's lazy loading a kernel is loaded
// at its first launch, and a load may wait for the device to go idle: with another rank's
// kernel already spinning for this one, that never happens. Call before the first collective.
void load_peer_kernels();

constexpr int kMaxPeerRanks = 8;
constexpr int kPeerBlocks = 32;

// One rank's flags, in its device's memory, zeroed before first use. flag[b][r]: the last launch
// whose slice rank r's block b has in r's staging (written by rank r); epoch[b]: the launches
// this rank's block b has run.
struct PeerFlags {
  uint32_t flag[kPeerBlocks][kMaxPeerRanks];
  uint32_t epoch[kPeerBlocks];
};

// What one rank's launches see: every rank's flags and staging (two halves of half_bytes each),
// by the addresses this rank's device reaches them at.
struct PeerGroup {
  int rank = 0, size = 0;
  PeerFlags* flags[kMaxPeerRanks] = {};
  void* staging[kMaxPeerRanks] = {};
  int64_t half_bytes = 0;
  const volatile int* abort = nullptr;  // nonzero: every wait gives up
};

// Each is one launch, of a message that fits a staging half (half_bytes); the caller splits
// larger ones.
//
// x (F32 or BF16, contiguous) = the sum of every rank's x, added in rank order in f32 (BF16
// rounded once at the end): the same bits on every rank.
void peer_all_reduce_sum(const KernelLaunch& launch, const PeerGroup& g, TensorView x);

// out [size * n] = every rank's x [n] in rank order, any dtype.
void peer_all_gather(const KernelLaunch& launch, const PeerGroup& g, TensorView x, TensorView out);

// Whether peer_all_reduce_add_rms_norm takes `rows` rows of `d` values of `dtype`: up to
// kPeerBlocks rows, one a block (decode batches). More rows would queue on the 32 blocks; the
// sum and norm.cu's kernels spread them over every SM instead (docs/PERF.md, `tetra bench
// collective`).
bool peer_add_rms_norm_takes(int64_t rows, int64_t d, DType dtype, const PeerGroup& g);

// h += the sum of every rank's delta (as peer_all_reduce_sum sums it), then out =
// rms_norm(h) * weight: the bits all_reduce_sum(delta) then add_rms_norm (norm.h) leave. delta
// is left as it was. h and delta: [rows, d] of one float dtype.
void peer_all_reduce_add_rms_norm(const KernelLaunch& launch, const PeerGroup& g, TensorView delta, TensorView h,
                                  TensorView weight, float eps, TensorView out);

}  // namespace tetra::ops::cuda
