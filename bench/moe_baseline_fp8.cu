// FP8 baseline of the MoE benchmark (see moe_baseline_fp8.h).
#include "bench/moe_baseline_fp8.h"

#include <cuda_fp8.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/moe_internal.h"

// Returns from the enclosing function (which returns std::string) with the failed call named.
#define TETRA_LT_OR_RETURN(expr)                                                                 \
  do {                                                                                           \
    const cublasStatus_t tetra_st_ = (expr);                                                     \
    if (tetra_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      return ::tetra::str_cat("cuBLASLt call failed: ", #expr, ": ", cublasLtGetStatusName(tetra_st_)); \
  } while (0)

namespace tetra::bench {
namespace {

// Static per-tensor scales: x is N(0, 1), in E4M3's range as it is, so its scale is 1 and its
// cast divides by nothing (nor does h's); the weights' brings N(0, 1) codes to N(0, 0.02^2).
constexpr float kActScale = 1.0f, kWeightScale = 0.02f;
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // as gemm_dense's: Hopper's large tiles

__device__ float2 bf16x2_to_float2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// Four floats to four E4M3 bytes, the first in the low byte; saturating, as a real cast does.
__device__ uint32_t e4m3x4(float2 lo, float2 hi) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3)) |
         uint32_t(__nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3)) << 16;
}

// The BF16 baseline's gather with the cast fused: row r of out is x row rows[r] as E4M3, one
// pass, 8 values (16 bytes in, 8 out) a step.
__global__ void gather_cast_kernel(const uint4* __restrict__ x, const int* __restrict__ rows, int row_vecs,
                                   uint2* __restrict__ out) {
  const int r = blockIdx.x;
  const uint4* src = x + int64_t(rows[r]) * row_vecs;
  for (int i = threadIdx.x; i < row_vecs; i += blockDim.x) {
    const uint4 v = src[i];
    out[int64_t(r) * row_vecs + i] = make_uint2(e4m3x4(bf16x2_to_float2(v.x), bf16x2_to_float2(v.y)),
                                                e4m3x4(bf16x2_to_float2(v.z), bf16x2_to_float2(v.w)));
  }
}

__device__ float2 silu_mul2(uint32_t g, uint32_t u) {
  const float2 gf = bf16x2_to_float2(g), uf = bf16x2_to_float2(u);
  return make_float2(gf.x / (1.0f + __expf(-gf.x)) * uf.x, gf.y / (1.0f + __expf(-gf.y)) * uf.y);
}

// The BF16 baseline's silu(gate) * up, written as E4M3 for the down GEMM; 8 values a step.
__global__ void silu_mul_cast_kernel(const uint4* __restrict__ g13, int inter_vecs, uint2* __restrict__ h) {
  const int r = blockIdx.x;
  const uint4* gate = g13 + int64_t(r) * 2 * inter_vecs;
  const uint4* up = gate + inter_vecs;
  for (int i = threadIdx.x; i < inter_vecs; i += blockDim.x) {
    const uint4 g = gate[i], u = up[i];
    h[int64_t(r) * inter_vecs + i] = make_uint2(e4m3x4(silu_mul2(g.x, u.x), silu_mul2(g.y, u.y)),
                                                e4m3x4(silu_mul2(g.z, u.z), silu_mul2(g.w, u.w)));
  }
}

}  // namespace

Fp8Experts::Fp8Experts(cudaStream_t stream, const ops::cuda::MoeShape& s, uint64_t seed)
    : shape(s),
      w13(size_t(n_stored()) * size_t(2 * s.intermediate * s.hidden)),
      w2(size_t(n_stored()) * size_t(s.hidden * s.intermediate)) {
  const int64_t n13 = int64_t(n_stored()) * 2 * s.intermediate * s.hidden, n2 = n13 / 2;
  ops::cuda::fill_random({.stream = stream}, TensorView{w13.p, DType::F8_E4M3, {n13}, Device::Cuda},
                         {.scale = 1.0f}, seed);
  ops::cuda::fill_random({.stream = stream}, TensorView{w2.p, DType::F8_E4M3, {n2}, Device::Cuda},
                         {.scale = 1.0f}, seed + 1);
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

Fp8Baseline::Fp8Baseline(cudaStream_t stream)
    : workspace_(std::make_unique<DeviceMem>(kWorkspaceBytes)), scales_(std::make_unique<DeviceMem>(2 * sizeof(float))) {
  const float scales[2] = {kActScale, kWeightScale};
  upload(stream, scales_->p, scales, sizeof scales);
  why_ = [&]() -> std::string {
    TETRA_LT_OR_RETURN(cublasLtCreate(&handle_));
    TETRA_LT_OR_RETURN(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
      return cublasLtMatmulDescSetAttribute(desc_, attr, &value, sizeof value);
    };
    // FP8 on Hopper takes only "TN": A (the weights) transposed, B (the activations) not.
    TETRA_LT_OR_RETURN(set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
    TETRA_LT_OR_RETURN(set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
    TETRA_LT_OR_RETURN(set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const float*>(scales_->p) + 1));
    TETRA_LT_OR_RETURN(set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const float*>(scales_->p)));
    // Fast accumulation: the baseline at its fastest, as FP8 serving kernels run on Hopper.
    TETRA_LT_OR_RETURN(set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(1)));
    return "";
  }();
}

Fp8Baseline::~Fp8Baseline() {
  for (auto& [key, p] : plans_)
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
      if (l) cublasLtMatrixLayoutDestroy(l);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  if (handle_) cublasLtDestroy(handle_);
}

const Fp8Baseline::Plan& Fp8Baseline::plan_gemm(const Fp8Gemm& g) {
  const auto [it, fresh] = plans_.try_emplace(g.key());
  Plan& p = it->second;
  if (!fresh) return p;
  p.why = [&]() -> std::string {
    if (!why_.empty()) return why_;
    if (std::string why = fp8_gemm_unsupported(g); !why.empty()) return why;
    const Fp8GemmLayouts l = fp8_gemm_layouts(g);
    TETRA_LT_OR_RETURN(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, l.a.rows, l.a.cols, l.a.ld));
    TETRA_LT_OR_RETURN(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, l.b.rows, l.b.cols, l.b.ld));
    TETRA_LT_OR_RETURN(
        cublasLtMatrixLayoutCreate(&p.d, g.out_f32 ? CUDA_R_32F : CUDA_R_16BF, l.d.rows, l.d.cols, l.d.ld));
    struct Preference {
      cublasLtMatmulPreference_t p = nullptr;
      ~Preference() {
        if (p) cublasLtMatmulPreferenceDestroy(p);
      }
    } pref;
    TETRA_LT_OR_RETURN(cublasLtMatmulPreferenceCreate(&pref.p));
    const uint64_t ws = kWorkspaceBytes;
    TETRA_LT_OR_RETURN(
        cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, l.a.align_bytes},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, l.b.align_bytes},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, l.d.align_bytes},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, l.d.align_bytes}};
    for (const auto& [attr, bytes] : alignments)
      TETRA_LT_OR_RETURN(cublasLtMatmulPreferenceSetAttribute(pref.p, attr, &bytes, sizeof bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    TETRA_LT_OR_RETURN(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, p.a, p.b, p.d, p.d, pref.p, 1, &result, &found));
    if (found < 1) return "cuBLASLt has no algorithm";
    p.algo = result.algo;
    return "";
  }();
  return p;
}

std::string Fp8Baseline::plan(const ops::cuda::MoeShape& shape, const HostGrouping& grouping) {
  const int64_t H = shape.hidden, I = shape.intermediate;
  for (const int n : grouping.counts) {
    if (n == 0) continue;
    for (const Fp8Gemm& g : {Fp8Gemm{2 * I, n, H, false}, Fp8Gemm{H, n, I, true}})
      if (const Plan& p = plan_gemm(g); !p.why.empty())
        return str_cat("the FP8 GEMM ", g.m, " x ", g.n, " x ", g.k, ": ", p.why);
  }
  return "";
}

std::string Fp8Baseline::gemm(cudaStream_t stream, const Fp8Gemm& g, const uint8_t* w, const uint8_t* act,
                              void* out) const {
  const auto it = plans_.find(g.key());
  if (it == plans_.end() || !it->second.why.empty()) return "an FP8 GEMM without a plan";
  const Plan& p = it->second;
  const float alpha = 1.0f, beta = 0.0f;
  TETRA_LT_OR_RETURN(cublasLtMatmul(handle_, desc_, &alpha, w, p.a, act, p.b, &beta, out, p.d, out, p.d, &p.algo,
                                    workspace_->p, kWorkspaceBytes, stream));
  return "";
}

std::string Fp8Baseline::enqueue(cudaStream_t stream, const Fp8Experts& ex, const uint16_t* x, int n_tokens,
                                 int top_k, const float* weights, const HostGrouping& grouping,
                                 const Fp8LayerBuffers& buf, uint16_t* out) const {
  if (!why_.empty()) return why_;
  const int64_t H = ex.shape.hidden, I = ex.shape.intermediate;
  const int rows = int(grouping.row_token.size());
  gather_cast_kernel<<<rows, 128, 0, stream>>>(reinterpret_cast<const uint4*>(x), buf.row_token, int(H / 8),
                                               reinterpret_cast<uint2*>(buf.xp));
  TETRA_CUDA_CHECK_LAUNCH("gather cast");
  const auto* w13 = ex.w13.as<const uint8_t>();
  const auto* w2 = ex.w2.as<const uint8_t>();
  for (int e = 0, row = 0; e < int(grouping.counts.size()); row += grouping.counts[size_t(e)], ++e) {
    const int n = grouping.counts[size_t(e)];
    if (n == 0) continue;
    if (std::string why = gemm(stream, {2 * I, n, H, false}, w13 + e * 2 * I * H, buf.xp + row * H,
                               buf.g13 + row * 2 * I);
        !why.empty())
      return why;
  }
  silu_mul_cast_kernel<<<rows, 128, 0, stream>>>(reinterpret_cast<const uint4*>(buf.g13), int(I / 8),
                                                 reinterpret_cast<uint2*>(buf.h));
  TETRA_CUDA_CHECK_LAUNCH("silu mul cast");
  for (int e = 0, row = 0; e < int(grouping.counts.size()); row += grouping.counts[size_t(e)], ++e) {
    const int n = grouping.counts[size_t(e)];
    if (n == 0) continue;
    if (std::string why = gemm(stream, {H, n, I, true}, w2 + e * H * I, buf.h + row * I, buf.y + row * H);
        !why.empty())
      return why;
  }
  ops::cuda::launch_combine({.stream = stream}, buf.y, buf.pos, weights, n_tokens, top_k, ex.shape.shared_expert,
                            int(H), out);
  return "";
}

}  // namespace tetra::bench
