// The CUDA backend (sm_90a): ops::Backend on one GPU. This header is what the rest of tetra
// sees of it; the ops live one family per file beside it and cuda_backend.cpp only dispatches.
#pragma once

#include <memory>
#include <string>

#include "ops/ops.h"

namespace tetra::ops::cuda {

struct CudaBackendOptions {
  int device_index = 0;
  std::string moe_tune_cache;  // "": tunings kept in memory only
  bool moe_autotune = true;    // time the MoE tiles at warm-up (else the heuristic decides)
  bool pdl = true;             // programmatic dependent launch (Context::pdl) where the device has it
  // The KV cache's element type: BF16, or F8_E4M3 (--kv-cache-dtype fp8_e4m3).
  DType kv_dtype = DType::BF16;
};

// Throws one sentence when there is no such device.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);

// True when a CUDA device answers (the driver loads and reports at least one device).
bool cuda_device_present();
int cuda_device_count();

}  // namespace tetra::ops::cuda
