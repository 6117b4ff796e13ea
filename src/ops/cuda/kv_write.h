// Writing a step's keys and values (or MLA latents, or indexer keys) into their slots of a
// paged cache; a slot of -1 (a padding token) writes nothing.
#pragma once

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

// rows [T, ...] -> cache [n_blocks, block_size, ...] at slot_mapping[t], converting the
// element type (activations BF16 -> cache dtype); an FP8 cache stores row / scale.
void cache_write(const KernelLaunch& launch, TensorView rows, TensorView slot_mapping, TensorView cache,
                 float scale = 1.0f);

}  // namespace tetra::ops::cuda
