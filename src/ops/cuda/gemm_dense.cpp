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
namespace {
// The head blocks of a weight start row0 rows in, so their pointers are promised only this
// alignment (cuBLASLt assumes 256 bytes unless told).
constexpr uint32_t kHeadAlignment = 16;
}  // namespace

DenseGemm::DenseGemm() {
  TETRA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = size_t(32) << 20;  // what cuBLASLt's heuristics want for Hopper's large tiles
  workspace_ = device_alloc(int64_t(workspace_bytes_), "the cuBLASLt workspace");
}

DenseGemm::~DenseGemm() {
  const auto destroy = [](Plan& p) {
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  };
  for (auto& [key, p] : plans_) destroy(p);
  for (auto& [key, p] : head_plans_) destroy(p);
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
  choose_algo(p);
  return p;
}

void DenseGemm::choose_algo(Plan& p, uint32_t min_alignment) {
  cublasLtMatmulPreference_t pref = nullptr;
  TETRA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  if (min_alignment > 0) {
    for (const auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      TETRA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &min_alignment, sizeof min_alignment));
  }
  TETRA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.ok) p.algo = result.algo;
}

DenseGemm::Plan& DenseGemm::head_plan(const HeadKey& key) {
  auto it = head_plans_.find(key);
  if (it != head_plans_.end()) return it->second;
  Plan& p = head_plans_[key];
  const auto [t, heads, head_stride, n_rows, k, transposed] = key;
  // Column-major, per head h: W_h is the block of rows [n_rows, k] (row-major), so a
  // column-major [k, n_rows] matrix with ld k, heads head_stride * k apart.
  //   plain:      out_h^T [n_rows, T] = (W_h)^T^T x_h^T: A = W_h ([k, n_rows], op T), B = x_h [k, T]
  //   transposed: out_h^T [k, T]      = W_h^T x_h^T:      A = W_h ([k, n_rows], op N), B = x_h [n_rows, T]
  // x_h and out_h are row-major [T, width] slices of [T, heads, width]: ld heads * width,
  // heads width apart.
  const int64_t x_width = transposed ? n_rows : k, out_width = transposed ? k : n_rows;
  TETRA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = transposed ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TETRA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  TETRA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const auto layout = [&](cublasLtMatrixLayout_t* l, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch_stride) {
    TETRA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, CUDA_R_16BF, rows, cols, ld));
    const int32_t count = int32_t(heads);
    TETRA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    TETRA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                        &batch_stride, sizeof batch_stride));
  };
  layout(&p.a, uint64_t(k), uint64_t(n_rows), k, head_stride * k);
  layout(&p.b, uint64_t(x_width), uint64_t(t), heads * x_width, x_width);
  layout(&p.d, uint64_t(out_width), uint64_t(t), heads * out_width, out_width);
  choose_algo(p, kHeadAlignment);
  return p;
}

bool DenseGemm::head_linear(cudaStream_t stream, TensorView x, const LinearWeight& w, int64_t head_stride,
                            int64_t row0, int64_t n_rows, bool transposed, TensorView out) {
  if (w.format != WeightFormat::Dense || w.weight.dtype != DType::BF16 || x.dtype != DType::BF16 ||
      out.dtype != DType::BF16 || !w.bias.empty())
    return false;
  const int64_t t = x.dim(0), heads = x.dim(1);
  if (t == 0) return true;
  const auto* weight = static_cast<const uint16_t*>(w.weight.data) + row0 * w.n_in;
  for (const void* ptr : {static_cast<const void*>(weight), static_cast<const void*>(x.data), static_cast<const void*>(out.data)})
    if (reinterpret_cast<uintptr_t>(ptr) % kHeadAlignment != 0) return false;
  Plan& p = head_plan({t, heads, head_stride, n_rows, w.n_in, transposed});
  if (!p.ok) return false;
  const float alpha = 1.0f, beta = 0.0f;
  TETRA_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, weight, p.a, x.data, p.b, &beta, out.data, p.d,
                                    out.data, p.d, &p.algo, workspace_, workspace_bytes_, stream));
  return true;
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
