// Rotary position embeddings on CUDA, in place (default, YaRN's scaled cos/sin, partial
// rotary dims, interleaved pairs), with the angles formed in fp32 as transformers forms them.
#pragma once

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

void rope(const KernelLaunch& launch, TensorView x, TensorView positions, const RopeSpec& spec);

}  // namespace tetra::ops::cuda
