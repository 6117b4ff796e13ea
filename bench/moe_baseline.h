// The benchmark's baseline: the same MoE layer with BF16 weights, one cuBLAS GEMM per active
// expert (gate+up, then down), grouped on the host from the routing the benchmark drew.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/moe_internal.h"

namespace tetra::bench {

// Device buffers of one token count; rows = T * (k + shared).
struct Bf16LayerBuffers {
  int* row_token = nullptr;  // [rows]
  int* pos = nullptr;        // [T * k']
  uint16_t* xp = nullptr;    // bf16 [rows, H]: x gathered in expert order
  uint16_t* g13 = nullptr;   // bf16 [rows, 2I]
  uint16_t* h = nullptr;     // bf16 [rows, I]
  float* y = nullptr;        // f32 [rows, H]
};

// Rows per stored expert, in expert order, and the layout arrays (host).
struct HostGrouping {
  std::vector<int> counts;     // [E']
  std::vector<int> row_token;  // [rows]
  std::vector<int> pos;        // [T * k']
};

HostGrouping group_by_expert(const std::vector<int>& ids, int n_tokens, int top_k, int n_experts,
                             bool shared);

// Enqueues the layer (gather, per-expert GEMMs, SiLU x up, per-expert GEMMs, combine) on the
// handle's stream; capturable.
void bf16_layer_enqueue(cublasHandle_t handle, cudaStream_t stream,
                        const ops::cuda::CudaMoeExperts& ex, const uint16_t* x, int n_tokens,
                        int top_k, const float* weights, const HostGrouping& grouping,
                        const Bf16LayerBuffers& buf, uint16_t* out);

}  // namespace tetra::bench
