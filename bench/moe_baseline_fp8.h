// The benchmark's FP8 baseline: the MoE layer with E4M3 weights and E4M3 activations, one
// cuBLASLt FP8 GEMM per active expert (gate+up, then down), grouped on the host as the BF16
// baseline groups them (moe_baseline.h). Scales are per tensor and static, as a calibrated
// FP8 checkpoint has them, so casting the activations is one pass with no amax.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "bench/graph_timing.h"
#include "bench/moe_baseline.h"
#include "ops/cuda/moe.h"

namespace tetra::bench {

// One GEMM of the layer: out [n, m] = act [n, k] x W^T, W [m, k]; all row-major.
struct Fp8Gemm {
  int64_t m = 0;         // output features: 2I (gate/up) or H (down)
  int64_t n = 0;         // rows: one expert's (token, slot) rows
  int64_t k = 0;         // inner: H (gate/up) or I (down)
  bool out_f32 = false;  // down writes f32, which the combine reads; gate/up writes bf16
  auto key() const { return std::tuple(m, n, k, out_f32); }
};

// One cuBLASLt matrix layout (column-major) and the alignment its pointers are promised.
struct Fp8Layout {
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  uint32_t align_bytes = 0;
};

// Row-major act [n, k] is column-major [k, n] (ld k) and W [m, k] is column-major [k, m]
// taken with op T, so D [m, n] column-major (ld m) is out [n, m] row-major: FP8's "TN".
struct Fp8GemmLayouts {
  Fp8Layout a, b, d;  // a: W (op T), b: act (op N), d: out (C too, beta 0)
};

// The operand of row stride row_bytes starts at some row of a 256-byte-aligned buffer: its
// pointer is aligned to the largest power of two dividing row_bytes, 256 at most.
inline uint32_t fp8_row_alignment(int64_t row_bytes) {
  const int64_t low = row_bytes & -row_bytes;
  return uint32_t(row_bytes <= 0 || low >= 256 ? 256 : low);
}

inline Fp8GemmLayouts fp8_gemm_layouts(const Fp8Gemm& g) {
  const int64_t out_bytes = g.out_f32 ? 4 : 2;
  return {.a = {uint64_t(g.k), uint64_t(g.m), g.k, fp8_row_alignment(g.k)},
          .b = {uint64_t(g.k), uint64_t(g.n), g.k, fp8_row_alignment(g.k)},
          .d = {uint64_t(g.m), uint64_t(g.n), g.m, fp8_row_alignment(g.m * out_bytes)}};
}

// Why cuBLASLt's FP8 GEMMs cannot take this shape ("" when they can): every leading
// dimension must span a multiple of 16 bytes, so K (an E4M3 row of A and of B) and the
// output row must.
inline std::string fp8_gemm_unsupported(const Fp8Gemm& g) {
  if (g.n < 1) return "no rows";
  if (g.k % 16 != 0) return "K = " + std::to_string(g.k) + " is not a multiple of 16";
  if (g.m * (g.out_f32 ? 4 : 2) % 16 != 0) return "an output row of " + std::to_string(g.m) + " is not 16-byte aligned";
  return "";
}

// One layer copy's FP8 experts, expert-major as CudaMoeExperts stores BF16 ones, E' =
// n_experts (+1 shared, last): w13 E4M3 [E', 2I, H] (gate rows, then up rows), w2 E4M3
// [E', H, I]; K is contiguous in both, as the "TN" GEMMs read them. Random N(0, 1) values;
// the weight scale brings them to the dummy weights' N(0, 0.02^2).
struct Fp8Experts {
  Fp8Experts(cudaStream_t stream, const ops::cuda::MoeShape& shape, uint64_t seed);
  int n_stored() const { return shape.n_experts + (shape.shared_expert ? 1 : 0); }

  ops::cuda::MoeShape shape;
  DeviceMem w13, w2;
};

// Device buffers of one token count; rows = T * (k + shared). row_token, pos, g13 and y are
// those of the BF16 baseline (the two run one after the other).
struct Fp8LayerBuffers {
  const int* row_token = nullptr;  // [rows]
  const int* pos = nullptr;        // [T * k']
  uint8_t* xp = nullptr;           // e4m3 [rows, H]: x gathered in expert order, cast
  uint16_t* g13 = nullptr;         // bf16 [rows, 2I]
  uint8_t* h = nullptr;            // e4m3 [rows, I]: silu(gate) * up, cast
  float* y = nullptr;              // f32 [rows, H]
};

// The cuBLASLt handle, its fixed workspace, the scales and the plans of the GEMMs the
// benchmark has needed so far (one per (m, n, k, out type), chosen outside any capture).
class Fp8Baseline {
 public:
  explicit Fp8Baseline(cudaStream_t stream);
  ~Fp8Baseline();
  Fp8Baseline(const Fp8Baseline&) = delete;
  Fp8Baseline& operator=(const Fp8Baseline&) = delete;

  // Plans every GEMM this grouping needs; call before capturing. "" when all have an
  // algorithm, else why not (the row's FP8 column is then n/a).
  std::string plan(const ops::cuda::MoeShape& shape, const HostGrouping& grouping);

  // Enqueues the layer (gather + cast, per-expert GEMMs, SiLU x up + cast, per-expert GEMMs,
  // combine) on `stream`; capturable, only after plan() returned "". "" or why a cuBLASLt call
  // failed (the capture is then to be thrown away).
  std::string enqueue(cudaStream_t stream, const Fp8Experts& ex, const uint16_t* x, int n_tokens, int top_k,
                      const float* weights, const HostGrouping& grouping, const Fp8LayerBuffers& buf,
                      uint16_t* out) const;

 private:
  struct Plan {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::string why;  // "" when the plan is usable
  };
  using Key = decltype(Fp8Gemm{}.key());
  const Plan& plan_gemm(const Fp8Gemm& g);
  std::string gemm(cudaStream_t stream, const Fp8Gemm& g, const uint8_t* w, const uint8_t* act, void* out) const;

  std::string why_;  // set when cuBLASLt could not be set up: every row is n/a
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  std::unique_ptr<DeviceMem> workspace_, scales_;
  std::map<Key, Plan> plans_;
};

}  // namespace tetra::bench
