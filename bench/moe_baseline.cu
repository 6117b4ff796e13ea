// BF16 baseline of the MoE benchmark (see moe_baseline.h).
#include <cuda_bf16.h>

#include "bench/moe_baseline.h"
#include "ops/cuda/cuda_check.h"

namespace tetra::bench {
namespace {

#define TETRA_CUBLAS_CHECK(expr)                                                  \
  do {                                                                            \
    cublasStatus_t st_ = (expr);                                                  \
    if (st_ != CUBLAS_STATUS_SUCCESS) fail("cuBLAS call failed: ", #expr, ": ", int(st_)); \
  } while (0)

__global__ void gather_rows_kernel(const uint4* __restrict__ x, const int* __restrict__ rows,
                                   int row_vecs, uint4* __restrict__ out) {
  const int r = blockIdx.x;
  const uint4* src = x + int64_t(rows[r]) * row_vecs;
  for (int i = threadIdx.x; i < row_vecs; i += blockDim.x) out[int64_t(r) * row_vecs + i] = src[i];
}

__global__ void silu_mul_kernel(const __nv_bfloat16* __restrict__ g13, int inter,
                                __nv_bfloat16* __restrict__ h) {
  const int r = blockIdx.x;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) {
    const float g = __bfloat162float(g13[int64_t(r) * 2 * inter + i]);
    const float u = __bfloat162float(g13[int64_t(r) * 2 * inter + inter + i]);
    h[int64_t(r) * inter + i] = __float2bfloat16_rn(g / (1.0f + __expf(-g)) * u);
  }
}

}  // namespace

HostGrouping group_by_expert(const std::vector<int>& ids, int n_tokens, int top_k, int n_experts,
                             bool shared) {
  const int kk = top_k + (shared ? 1 : 0), n_stored = n_experts + (shared ? 1 : 0);
  HostGrouping g;
  g.counts.assign(size_t(n_stored), 0);
  auto expert_of = [&](int t, int j) { return j < top_k ? ids[size_t(t * top_k + j)] : n_experts; };
  for (int t = 0; t < n_tokens; ++t)
    for (int j = 0; j < kk; ++j) ++g.counts[size_t(expert_of(t, j))];
  std::vector<int> next(size_t(n_stored), 0);
  for (int e = 1; e < n_stored; ++e) next[size_t(e)] = next[size_t(e - 1)] + g.counts[size_t(e - 1)];
  g.row_token.assign(size_t(n_tokens * kk), 0);
  g.pos.assign(size_t(n_tokens * kk), 0);
  for (int t = 0; t < n_tokens; ++t)
    for (int j = 0; j < kk; ++j) {
      const int row = next[size_t(expert_of(t, j))]++;
      g.row_token[size_t(row)] = t;
      g.pos[size_t(t * kk + j)] = row;
    }
  return g;
}

void bf16_layer_enqueue(cublasHandle_t handle, cudaStream_t stream,
                        const ops::cuda::CudaMoeExperts& ex, const uint16_t* x, int n_tokens,
                        int top_k, const float* weights, const HostGrouping& grouping,
                        const Bf16LayerBuffers& buf, uint16_t* out) {
  const int H = int(ex.shape.hidden), I = int(ex.shape.intermediate);
  const int rows = int(grouping.row_token.size());
  gather_rows_kernel<<<rows, 128, 0, stream>>>(reinterpret_cast<const uint4*>(x), buf.row_token,
                                               H / 8, reinterpret_cast<uint4*>(buf.xp));
  TETRA_CUDA_CHECK_LAUNCH("gather rows");
  const float one = 1.0f, zero = 0.0f;
  const auto* w13 = static_cast<const uint16_t*>(ex.w13);
  const auto* w2 = static_cast<const uint16_t*>(ex.w2);
  // Column-major view: C[2I, n] = W13 [2I, H] (row-major, so op T of an [H, 2I] matrix) x X^T.
  for (int e = 0, row = 0; e < int(grouping.counts.size()); row += grouping.counts[size_t(e)], ++e) {
    const int n = grouping.counts[size_t(e)];
    if (n == 0) continue;
    TETRA_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, n, H, &one,
                                    w13 + int64_t(e) * 2 * I * H, CUDA_R_16BF, H,
                                    buf.xp + int64_t(row) * H, CUDA_R_16BF, H, &zero,
                                    buf.g13 + int64_t(row) * 2 * I, CUDA_R_16BF, 2 * I,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  silu_mul_kernel<<<rows, 256, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(buf.g13), I,
                                            reinterpret_cast<__nv_bfloat16*>(buf.h));
  TETRA_CUDA_CHECK_LAUNCH("silu mul");
  for (int e = 0, row = 0; e < int(grouping.counts.size()); row += grouping.counts[size_t(e)], ++e) {
    const int n = grouping.counts[size_t(e)];
    if (n == 0) continue;
    TETRA_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, H, n, I, &one,
                                    w2 + int64_t(e) * H * I, CUDA_R_16BF, I,
                                    buf.h + int64_t(row) * I, CUDA_R_16BF, I, &zero,
                                    buf.y + int64_t(row) * H, CUDA_R_32F, H,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  ops::cuda::launch_combine({.stream = stream}, buf.y, buf.pos, weights, n_tokens, top_k,
                            ex.shape.shared_expert, H, out);
}

}  // namespace tetra::bench
