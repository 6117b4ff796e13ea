// The CPU ranks' sums (F32 or BF16 tensors in host memory): each value read as f32, the ranks
// added in rank order, BF16 rounded once when written back. The CPU communicator (ranks as
// threads) and the TCP one (ranks on several nodes) both use these, so they give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/tensor.h"

namespace tetra::parallel {

inline float host_value(const void* p, DType d, int64_t i) {
  return d == DType::F32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

// x [n] = sum [n], in x's dtype.
inline void store_sum(TensorView x, const float* sum) {
  const int64_t n = x.numel();
  if (x.dtype == DType::F32) {
    std::memcpy(x.data, sum, size_t(n) * 4);
    return;
  }
  uint16_t* dst = x.as<uint16_t>();
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(sum[i]);
}

}  // namespace tetra::parallel
