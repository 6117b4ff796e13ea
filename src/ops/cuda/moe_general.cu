// The MoE layer for expert shapes off the fast kernels' grid (small models, odd widths): one
// warp per output value, f32 intermediates, the routed outputs of a token summed in expert
// order as the CPU reference sums them. Exact rather than fast; shapes that are multiples of
// 128 never come here (so it reads the row-major layout only). Also the dummy expert fill,
// which must match the CPU's draws, in either layout.
#include "core/dummy_random.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/nvfp4_tile.h"
#include "ops/cuda/nvfp4_word.h"

namespace tetra::ops::cuda {
namespace {

constexpr int kWarps = 8;

// One matrix of one expert in the packed layout (moe_internal.h).
struct ExpertMatrix {
  const uint8_t* w;      // this matrix's first row
  const uint8_t* scale;  // NVFP4
  float global_scale;
  int64_t n_in;
  bool nvfp4;
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// row . v over n_in values, v f32 or bf16 (x), summed over the warp.
template <typename V>
__device__ float row_dot(const ExpertMatrix& m, int64_t row, const V* v) {
  const int lane = threadIdx.x % 32;
  float acc = 0.0f;
  if (m.nvfp4) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(m.w + row * (m.n_in / 2));
    const uint8_t* scales = m.scale + row * (m.n_in / 16);
    for (int64_t kw = lane; kw < m.n_in / 8; kw += 32) {
      const uint32_t word = words[kw];
      const float s = e4m3_to_float(scales[kw / 2]) * m.global_scale;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float x = sizeof(V) == 4 ? float(v[kw * 8 + i]) : bf16_bits_to_float(uint16_t(v[kw * 8 + i]));
        acc += e2m1_to_float(nvfp4_device_code(word, i)) * s * x;
      }
    }
  } else {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(m.w) + row * m.n_in;
    for (int64_t k = lane; k < m.n_in; k += 32) {
      const float x = sizeof(V) == 4 ? float(v[k]) : bf16_bits_to_float(uint16_t(v[k]));
      acc += bf16_bits_to_float(w[k]) * x;
    }
  }
  return warp_sum(acc);
}

struct GeneralArgs {
  const uint8_t* w13;
  const uint8_t* w2;
  const uint8_t* w13_scale;
  const uint8_t* w2_scale;
  const float* global_scale;
  int64_t w13_bytes, w2_bytes, s13_bytes, s2_bytes;  // per expert
  int64_t hidden, inter;
  int first_expert, n_experts;
  bool shared, nvfp4, nvfp4_down;
  const uint16_t* x;
  const int* ids;
  const float* weights;
  int n_tokens, top_k;
  float* h;  // [rows, I]
  float* y;  // [rows, H]
  uint16_t* out;
};

// Row r < T*k is (token r / k, choice r % k); rows after that are the shared expert's.
__device__ __forceinline__ int expert_of_row(const GeneralArgs& a, int64_t r, int64_t* token) {
  const int64_t routed = int64_t(a.n_tokens) * a.top_k;
  if (r < routed) {
    *token = r / a.top_k;
    return moe_stored_expert(a.ids, int(*token), int(r % a.top_k), a.top_k, a.first_expert, a.n_experts);
  }
  *token = r - routed;
  return a.n_experts;
}

__device__ ExpertMatrix matrix(const GeneralArgs& a, int e, int which) {
  // which: 0 gate, 1 up (rows I.. of w13), 2 down.
  ExpertMatrix m;
  m.nvfp4 = which < 2 ? a.nvfp4 : a.nvfp4_down;
  m.global_scale = a.global_scale[e * 3 + which];
  if (which < 2) {
    const int64_t row0 = which * a.inter;
    m.n_in = a.hidden;
    m.w = a.w13 + e * a.w13_bytes + row0 * (a.nvfp4 ? a.hidden / 2 : a.hidden * 2);
    m.scale = a.nvfp4 ? a.w13_scale + e * a.s13_bytes + row0 * (a.hidden / 16) : nullptr;
  } else {
    m.n_in = a.inter;
    m.w = a.w2 + e * a.w2_bytes;
    m.scale = a.nvfp4_down ? a.w2_scale + e * a.s2_bytes : nullptr;
  }
  return m;
}

__global__ void general_gate_up_kernel(GeneralArgs a, int64_t rows) {
  const int64_t item = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (item >= rows * a.inter) return;
  const int64_t r = item / a.inter, i = item % a.inter;
  int64_t t;
  const int e = expert_of_row(a, r, &t);
  float hv = 0.0f;
  if (e >= 0) {
    const uint16_t* xt = a.x + t * a.hidden;
    const float g = row_dot(matrix(a, e, 0), i, xt);
    const float u = row_dot(matrix(a, e, 1), i, xt);
    hv = g / (1.0f + expf(-g)) * u;
  }
  if (threadIdx.x % 32 == 0) a.h[r * a.inter + i] = hv;
}

__global__ void general_down_kernel(GeneralArgs a, int64_t rows) {
  const int64_t item = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (item >= rows * a.hidden) return;
  const int64_t r = item / a.hidden, j = item % a.hidden;
  int64_t t;
  const int e = expert_of_row(a, r, &t);
  const float v = e >= 0 ? row_dot(matrix(a, e, 2), j, a.h + r * a.inter) : 0.0f;
  if (threadIdx.x % 32 == 0) a.y[r * a.hidden + j] = v;
}

// out[t, j] = sum over the token's choices in (expert, slot) order of weight * y, then + the
// shared expert's y: the CPU reference's order of additions.
__global__ void general_combine_kernel(GeneralArgs a) {
  const int64_t n = int64_t(a.n_tokens) * a.hidden;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.hidden, j = idx % a.hidden;
    int done = 0;
    int last_e = -1, last_slot = -1;
    float sum = 0.0f;
    // Selection by (expert, slot) without sorting into an array: k is small.
    for (int step = 0; step < a.top_k; ++step) {
      int best_e = 0x7fffffff, best_slot = -1;
      for (int s = 0; s < a.top_k; ++s) {
        const int e = a.ids[t * a.top_k + s];
        const bool after = e > last_e || (e == last_e && s > last_slot);
        if (after && (e < best_e || (e == best_e && s < best_slot))) best_e = e, best_slot = s;
      }
      if (best_slot < 0) break;
      last_e = best_e, last_slot = best_slot;
      ++done;
      if (best_e < a.first_expert || best_e - a.first_expert >= a.n_experts) continue;  // another rank's
      const int64_t r = t * a.top_k + best_slot;
      sum += a.y[r * a.hidden + j] * a.weights[r];
    }
    if (a.shared) sum += a.y[(int64_t(a.n_tokens) * a.top_k + t) * a.hidden + j];
    a.out[idx] = __bfloat16_as_ushort(__float2bfloat16(sum));
  }
}

// ---- dummy experts ----
// The CPU's random_experts draws, per expert e, gate / up / down in that order, each NVFP4
// matrix as (codes, scales) with seeds seed + 6e + 2m (+1), each BF16 one from seed + 3e + m.

// Matrix m (0 gate, 1 up, 2 down) of a tiled expert: the row of the packed matrix that holds
// its row `row` (nvfp4_tile.h interleaves gate and up).
__device__ __forceinline__ int64_t tiled_row(int64_t m, int64_t row) {
  return m == 2 ? row : nvfp4_gate_up_row(row, m == 1);
}

// Word i is word w of expert e's matrices in row-major order (gate, up, or down alone);
// `tiled` stores it in the blocks of nvfp4_tile.h.
__global__ void dummy_codes_kernel(uint32_t* dst, int64_t words_per_expert, int64_t words_per_row,
                                   int64_t rows_per_matrix, int first_matrix, int64_t n_words, uint64_t seed,
                                   bool tiled) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / words_per_expert, w = i % words_per_expert;
    const int64_t row = w / words_per_row, m = first_matrix + row / rows_per_matrix;
    const int64_t logical = (row % rows_per_matrix) * words_per_row + w % words_per_row;
    const uint64_t s = seed + uint64_t(6 * e + 2 * m);
    uint32_t word = 0;
    for (int b = 0; b < 4; ++b) word |= uint32_t(dummy_byte(s, uint64_t(4 * logical + b), 0, 256)) << (8 * b);
    const int64_t to =
        tiled ? nvfp4_tiled_code_offset(tiled_row(m, row % rows_per_matrix), 4 * (w % words_per_row), 8 * words_per_row) / 4
              : w;
    dst[e * words_per_expert + to] = nvfp4_device_word(word);
  }
}

// Byte i is scale b of expert e's matrices in row-major order (groups_per_row a row).
__global__ void dummy_scales_kernel(uint8_t* dst, int64_t bytes_per_expert, int64_t bytes_per_matrix,
                                    int64_t groups_per_row, int first_matrix, int64_t n, uint64_t seed, int lo,
                                    int span, bool tiled) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / bytes_per_expert, b = i % bytes_per_expert;
    const int64_t m = first_matrix + b / bytes_per_matrix, in_matrix = b % bytes_per_matrix;
    const int64_t to = tiled ? nvfp4_tiled_scale_offset(tiled_row(m, in_matrix / groups_per_row),
                                                        in_matrix % groups_per_row, 16 * groups_per_row)
                             : b;
    dst[e * bytes_per_expert + to] =
        dummy_byte(seed + uint64_t(6 * e + 2 * m + 1), uint64_t(in_matrix), lo, span);
  }
}

__global__ void dummy_dense_kernel(uint16_t* dst, int64_t per_expert, int64_t per_matrix, int first_matrix, int64_t n,
                                   uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / per_expert, v = i % per_expert;
    const int64_t m = first_matrix + v / per_matrix;
    const float x = 0.0f + 0.02f * dummy_normal(seed + uint64_t(3 * e + m), uint64_t(v % per_matrix));
    dst[i] = __bfloat16_as_ushort(__float2bfloat16(x));
  }
}

int grid_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

}  // namespace

int64_t moe_general_scratch_bytes(const CudaMoeExperts& ex, int64_t n_tokens, int top_k) {
  const int64_t rows = n_tokens * (top_k + (ex.shape.shared_expert ? 1 : 0));
  return rows * (ex.shape.intermediate + ex.shape.hidden) * int64_t(sizeof(float));
}

void launch_moe_general(cudaStream_t stream, const CudaMoeExperts& ex, const uint16_t* x, const int* ids,
                        const float* weights, int n_tokens, int top_k, void* scratch, uint16_t* out) {
  GeneralArgs a;
  a.w13 = static_cast<const uint8_t*>(ex.w13);
  a.w2 = static_cast<const uint8_t*>(ex.w2);
  a.w13_scale = ex.w13_scale;
  a.w2_scale = ex.w2_scale;
  a.global_scale = ex.global_scale;
  a.w13_bytes = ex.w13_expert_bytes();
  a.w2_bytes = ex.w2_expert_bytes();
  a.s13_bytes = ex.w13_scale_expert_bytes();
  a.s2_bytes = ex.w2_scale_expert_bytes();
  a.hidden = ex.shape.hidden;
  a.inter = ex.shape.intermediate;
  a.first_expert = int(ex.first_expert());
  a.n_experts = ex.shape.n_experts;
  a.shared = ex.shape.shared_expert;
  a.nvfp4 = ex.format == WeightFormat::Nvfp4;
  a.nvfp4_down = ex.down_format == WeightFormat::Nvfp4;
  a.x = x;
  a.ids = ids;
  a.weights = weights;
  a.n_tokens = n_tokens;
  a.top_k = top_k;
  const int64_t rows = int64_t(n_tokens) * (top_k + (a.shared ? 1 : 0));
  a.h = static_cast<float*>(scratch);
  a.y = a.h + rows * a.inter;
  a.out = out;
  if (n_tokens == 0) return;
  const int64_t gate_items = rows * a.inter, down_items = rows * a.hidden;
  TETRA_CHECK((gate_items + kWarps - 1) / kWarps < (int64_t(1) << 31) && (down_items + kWarps - 1) / kWarps < (int64_t(1) << 31),
              "moe: too many tokens for the general path in one call");
  general_gate_up_kernel<<<unsigned((gate_items + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(a, rows);
  TETRA_CUDA_CHECK_LAUNCH("moe general gate/up");
  general_down_kernel<<<unsigned((down_items + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(a, rows);
  TETRA_CUDA_CHECK_LAUNCH("moe general down");
  general_combine_kernel<<<grid_for(int64_t(n_tokens) * a.hidden), 256, 0, stream>>>(a);
  TETRA_CUDA_CHECK_LAUNCH("moe general combine");
}

void launch_fill_dummy_experts(cudaStream_t stream, const CudaMoeExperts& ex, uint64_t seed) {
  const int64_t n = ex.n_stored(), H = ex.shape.hidden, I = ex.shape.intermediate;
  // A matrix's seeds depend on the format of every matrix before it (NVFP4 takes two, BF16
  // one): the CPU draws the experts' matrices one after another.
  const bool fp4 = ex.format == WeightFormat::Nvfp4;
  TETRA_CHECK(ex.down_format == ex.format, "moe: dummy experts have one format for all their matrices");
  if (fp4) {
    const int64_t w13_words = ex.w13_expert_bytes() / 4, w2_words = ex.w2_expert_bytes() / 4;
    const bool tiled = ex.tiled();
    dummy_codes_kernel<<<grid_for(n * w13_words), 256, 0, stream>>>(static_cast<uint32_t*>(ex.w13), w13_words, H / 8,
                                                                   I, 0, n * w13_words, seed, tiled);
    dummy_codes_kernel<<<grid_for(n * w2_words), 256, 0, stream>>>(static_cast<uint32_t*>(ex.w2), w2_words, I / 8, H,
                                                                  2, n * w2_words, seed, tiled);
    dummy_scales_kernel<<<grid_for(n * ex.w13_scale_expert_bytes()), 256, 0, stream>>>(
        ex.w13_scale, ex.w13_scale_expert_bytes(), I * (H / 16), H / 16, 0, n * ex.w13_scale_expert_bytes(), seed,
        kDummyNvfp4ScaleLo, kDummyNvfp4ScaleSpan, tiled);
    dummy_scales_kernel<<<grid_for(n * ex.w2_scale_expert_bytes()), 256, 0, stream>>>(
        ex.w2_scale, ex.w2_scale_expert_bytes(), H * (I / 16), I / 16, 2, n * ex.w2_scale_expert_bytes(), seed,
        kDummyNvfp4ScaleLo, kDummyNvfp4ScaleSpan, tiled);
  } else {
    dummy_dense_kernel<<<grid_for(n * 2 * I * H), 256, 0, stream>>>(static_cast<uint16_t*>(ex.w13), 2 * I * H, I * H, 0,
                                                                   n * 2 * I * H, seed);
    dummy_dense_kernel<<<grid_for(n * H * I), 256, 0, stream>>>(static_cast<uint16_t*>(ex.w2), H * I, H * I, 2,
                                                               n * H * I, seed);
  }
  TETRA_CUDA_CHECK_LAUNCH("dummy experts");
}

}  // namespace tetra::ops::cuda
