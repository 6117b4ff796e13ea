#include "ops/cuda/gemm_dense.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_memory.h"

#define TETRA_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                       \
    const cublasStatus_t tetra_st_ = (expr);                                                 \
    if (tetra_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::tetra::fail("cuBLASLt call failed: ", #expr, ": status ", int(tetra_st_));            \
  } while (0)

namespace tetra::ops::cuda {

DenseGemm::DenseGemm() {
  TETRA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = size_t(32) << 20;  // what cuBLASLt's heuristics want for Hopper's large tiles
  workspace_ = device_alloc(int64_t(workspace_bytes_), "the cuBLASLt workspace");
}

DenseGemm::~DenseGemm() {
  for (auto& [key, p] : plans_) {
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

DenseGemm::Plan& DenseGemm::plan(const Key& key, cudaDataType_t wt, cudaDataType_t ot) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan& p = plans_[key];
  const auto [t, n_out, n_in, wdt, odt] = key;
  // Row-major out [T, n_out] is column-major [n_out, T] = W [n_out, n_in] x^T, where the
  // row-major W is column-major [n_in, n_out] (transposed) and x is column-major [n_in, T].
  TETRA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TETRA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  TETRA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  TETRA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, wt, uint64_t(n_in), uint64_t(n_out), n_in));
  TETRA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, wt, uint64_t(n_in), uint64_t(t), n_in));
  TETRA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, ot, uint64_t(n_out), uint64_t(t), n_out));
  cublasLtMatmulPreference_t pref = nullptr;
  TETRA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  TETRA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.ok) p.algo = result.algo;
  return p;
}

bool DenseGemm::linear(cudaStream_t stream, TensorView x, const LinearWeight& w, TensorView out) {
  const DType wdt = w.weight.dtype;
  if (w.format != WeightFormat::Dense || wdt != x.dtype || (wdt != DType::BF16 && wdt != DType::F16)) return false;
  if (out.dtype != DType::BF16 && out.dtype != DType::F32) return false;
  const int64_t t = x.numel() / w.n_in;
  if (t == 0) return true;
  const cudaDataType_t wt = wdt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const cudaDataType_t ot = out.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  Plan& p = plan({t, w.n_out, w.n_in, int(wdt), int(out.dtype)}, wt, ot);
  if (!p.ok) return false;
  const float alpha = 1.0f, beta = 0.0f;
  TETRA_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w.weight.data, p.a, x.data, p.b, &beta, out.data, p.d,
                                    out.data, p.d, &p.algo, workspace_, workspace_bytes_, stream));
  return true;
}

}  // namespace tetra::ops::cuda
