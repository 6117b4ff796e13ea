// Collectives among the ranks one model is split over (tensor and expert parallelism). One
// Communicator a rank, as NCCL has one communicator a device: every rank calls the same
// collectives in the same order with tensors of the same shape. The CPU implementation
// (parallel/cpu_communicator.h) joins ranks that are threads of one process; on CUDA, ranks
// that are threads meet through peer memory (parallel/cuda_peer_communicator.h) and NCCL joins
// GPUs. It travels in ops::Context, never in a global.
#pragma once

#include <string>

#include "core/tensor.h"

namespace tetra::ops {

struct Context;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x (F32 or BF16, contiguous, on this rank's device) becomes the sum of every rank's x,
  // the same bits on every rank. Ordered on ctx's stream where the device has streams.
  virtual void all_reduce_sum(const Context& ctx, TensorView x) = 0;
  // out [size * n] = every rank's x [n] one after another in rank order (same dtype).
  virtual void all_gather(const Context& ctx, TensorView x, TensorView out) = 0;
  // h += the sum of every rank's delta, then out = rms_norm(h) * weight, as all_reduce_sum(delta)
  // and Backend::add_rms_norm would leave them, in one step where this communicator can fuse
  // the two; delta then holds its own part or the sum. False where it cannot (nothing done):
  // the caller runs the two.
  virtual bool all_reduce_sum_add_rms_norm(const Context& ctx, TensorView delta, TensorView h, TensorView weight,
                                           float eps, TensorView out) {
    (void)ctx, (void)delta, (void)h, (void)weight, (void)eps, (void)out;
    return false;
  }
  // Whether its collectives may be captured in a CUDA graph and replayed (nothing on the host).
  virtual bool capturable() const { return false; }
  // A rank failed: every rank's collective that waits now or is called later throws, with
  // `reason` in its message, instead of waiting for a rank that will never come.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace tetra::ops
