// Collectives among the ranks one model is split over (tensor and expert parallelism). One
// Communicator a rank, as NCCL has one communicator a device: every rank calls the same
// collectives in the same order with tensors of the same shape. The CPU implementation
// (parallel/cpu_communicator.h) joins ranks that are threads of one process; an NCCL one
// joins the GPUs of one host. It travels in ops::Context, never in a global.
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
  // A rank failed: every rank's collective that waits now or is called later throws, with
  // `reason` in its message, instead of waiting for a rank that will never come.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace tetra::ops
