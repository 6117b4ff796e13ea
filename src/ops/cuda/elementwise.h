// Row and element kernels of the CUDA backend: embedding lookup, SiLU-and-multiply, add,
// row gathers, column copies, bias and dummy-weight fills. Element types are BF16, F16 or F32
// (activations BF16); every launcher checks its arguments and enqueues on `stream`.
#pragma once

#include <cuda_runtime.h>

#include "ops/ops.h"

namespace tetra::ops::cuda {

void embedding(cudaStream_t stream, TensorView table, TensorView ids, TensorView out);
void silu_mul(cudaStream_t stream, TensorView gate, TensorView up, TensorView out);
void add(cudaStream_t stream, TensorView a, TensorView b, TensorView out);
void gather_rows(cudaStream_t stream, TensorView x, TensorView rows, TensorView out);
void copy_columns(cudaStream_t stream, TensorView src, int64_t src_col0, TensorView dst,
                  int64_t dst_col0, int64_t n);
// out [T, N] += bias [N].
void add_bias(cudaStream_t stream, TensorView out, TensorView bias);
// Dummy weights, value for value those of the CPU backend (core/dummy_random.h).
void fill_random(cudaStream_t stream, TensorView t, const RandomFill& fill, uint64_t seed);

}  // namespace tetra::ops::cuda
