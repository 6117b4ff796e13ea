#include "ops/cuda/kv_write.h"

#include <cmath>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

// Slot -1 (a padding row of a graph-sized decode batch) writes nothing, nor does a slot past
// the cache: a fault in a kernel would take the whole context down where the CPU backend
// throws.
__global__ void cache_write_kernel(const void* rows, DType rdt, const int32_t* slots, int64_t n_tokens,
                                   int64_t width, int64_t n_slots, void* cache, DType cdt, float scale) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = n_tokens * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, c = i % width;
    const int32_t slot = slots[t];
    if (slot < 0 || slot >= n_slots) continue;
    store_float(cache, int64_t(slot) * width + c, cdt, to_cache_value(load_float(rows, i, rdt), cdt, scale));
  }
}

}  // namespace

void cache_write(const KernelLaunch& launch, TensorView rows, TensorView slot_mapping, TensorView cache, float scale) {
  const int64_t n_tokens = slot_mapping.numel();
  TETRA_CHECK(cache.shape.rank >= 2, "cache_write: the cache must be [n_blocks, block_size, ...]");
  const int64_t n_slots = cache.dim(0) * cache.dim(1);
  const int64_t width = n_tokens ? rows.numel() / n_tokens : 0;
  TETRA_CHECK(n_tokens == 0 || (rows.numel() == n_tokens * width && width * n_slots == cache.numel()),
              "cache_write: rows of ", width, " values do not fit a cache of shape ", cache.shape.str());
  TETRA_CHECK(slot_mapping.dtype == DType::I32, "cache_write: slots must be I32");
  TETRA_CHECK(std::isfinite(scale) && scale > 0, "cache_write: the cache scale must be positive, not ", scale);
  if (n_tokens == 0 || width == 0) return;
  const int64_t total = n_tokens * width;
  const int blocks = int(std::min<int64_t>((total + 255) / 256, 65535 * 8));
  launch_kernel(launch, cache_write_kernel, blocks, 256, 0, rows.data, rows.dtype, slot_mapping.as<const int32_t>(),
                n_tokens, width, n_slots, cache.data, cache.dtype, scale);
  TETRA_CUDA_CHECK_LAUNCH("cache_write");
}

}  // namespace tetra::ops::cuda
