// Dense BF16 linear layers through cuBLASLt: out [T, n_out] = x [T, n_in] W^T with f32
// accumulation, out BF16 or F32. One handle and one workspace for the backend's lifetime
// (no allocation during a step, so capturable); the algorithm for each shape is chosen once.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "ops/ops.h"

namespace tetra::ops::cuda {

class DenseGemm {
 public:
  DenseGemm();
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // False when cuBLASLt has no algorithm for these types and strides; the caller then runs
  // the general kernel. The bias is the caller's.
  bool linear(cudaStream_t stream, TensorView x, const LinearWeight& w, TensorView out);
  // Backend::head_linear as one strided-batched GEMM over the heads (BF16 x, weight and out);
  // false where cuBLASLt has no algorithm.
  bool head_linear(cudaStream_t stream, TensorView x, const LinearWeight& w, int64_t head_stride, int64_t row0,
                   int64_t n_rows, bool transposed, TensorView out);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  // (tokens, n_out, n_in, weight dtype, out dtype)
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int>;
  Plan& plan(const Key& key, cudaDataType_t wt, cudaDataType_t ot);
  // (tokens, heads, head_stride, n_rows, n_in, transposed)
  using HeadKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
  Plan& head_plan(const HeadKey& key);
  void choose_algo(Plan& p, uint32_t min_alignment = 0);  // 0: cuBLASLt's default (256 bytes)

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
  std::map<HeadKey, Plan> head_plans_;
};

}  // namespace tetra::ops::cuda
