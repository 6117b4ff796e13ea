// Linear layers on CUDA: out [T, n_out] = x [T, n_in] W^T (+ bias). BF16 and F16 weights go
// through cuBLASLt (gemm_dense.h) where it takes the shape; this general kernel covers the
// rest: NVFP4 and FP8 weights decoded in the kernel (as the CPU reference decodes them), F32
// weights, and any size. x BF16 or F32; out BF16 or F32 (router logits, lm_head).
#pragma once

#include "ops/cuda/launch.h"
#include "ops/ops.h"

namespace tetra::ops::cuda {

void linear_general(const KernelLaunch& launch, TensorView x, const LinearWeight& w, TensorView out);

// Backend::head_linear for every weight format (the dense BF16 case has a batched GEMM in
// gemm_dense.h). The caller checks the shapes.
void head_linear_general(const KernelLaunch& launch, TensorView x, const LinearWeight& w, int64_t head_stride,
                         int64_t row0, int64_t n_rows, bool transposed, TensorView out);

}  // namespace tetra::ops::cuda
