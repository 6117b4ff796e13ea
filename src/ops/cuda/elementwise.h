// Row and element kernels of the CUDA backend: embedding lookup, SiLU-and-multiply, add,
// row gathers, column copies, bias and dummy-weight fills. Element types are BF16, F16 or F32
// (activations BF16); every launcher checks its arguments and enqueues as `launch` says (launch.h).
#pragma once

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

void embedding(const KernelLaunch& launch, TensorView table, TensorView ids, TensorView out);
void silu_mul(const KernelLaunch& launch, TensorView gate, TensorView up, TensorView out);
void add(const KernelLaunch& launch, TensorView a, TensorView b, TensorView out);
void gather_rows(const KernelLaunch& launch, TensorView x, TensorView rows, TensorView out);
void copy_columns(const KernelLaunch& launch, TensorView src, int64_t src_col0, TensorView dst, int64_t dst_col0,
                  int64_t n);
// out [T, N] += bias [N].
void add_bias(const KernelLaunch& launch, TensorView out, TensorView bias);
// Dummy weights, value for value those of the CPU backend (core/dummy_random.h).
void fill_random(const KernelLaunch& launch, TensorView t, const RandomFill& fill, uint64_t seed);

}  // namespace tetra::ops::cuda
