// The read-ceiling probe of `tetra bench moe` (read_probe.h).
#include "bench/read_probe.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "bench/event_timing.h"
#include "ops/cuda/cuda_check.h"

namespace tetra::bench {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;  // 16-byte loads in flight per thread

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Every thread XORs what it reads and stores the result only where it equals one constant,
// so the loads cannot be dropped and the stores (almost) never happen.
__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* __restrict__ src, int64_t n_vec, uint32_t* sink) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  uint32_t acc = 0;
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n_vec; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ld_stream(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n_vec; i += stride) {
    const uint4 v = ld_stream(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Nonzero, varied contents: the protocol reads random data, never zeros.
__global__ void fill_kernel(uint32_t* dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = uint32_t(i) * 2654435761u + 1u;
}

}  // namespace

ReadCeiling measure_read_ceiling(cudaStream_t stream, int sm_count, int64_t bytes, int iters) {
  TETRA_CHECK(bytes >= (int64_t(64) << 20) && bytes % 16 == 0 && iters >= 1, "read probe: bad size or count");
  void* buf = nullptr;
  TETRA_CUDA_CHECK(cudaMalloc(&buf, size_t(bytes) + 16));
  std::unique_ptr<void, cudaError_t (*)(void*)> owned(buf, &cudaFree);  // freed on a throw
  fill_kernel<<<sm_count * 4, 256, 0, stream>>>(static_cast<uint32_t*>(buf), bytes / 4);
  const auto* src = static_cast<const uint4*>(buf);
  auto* sink = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(buf) + bytes);
  const int64_t n_vec = bytes / 16;
  const int blocks = sm_count * (2048 / kThreads);  // a full wave of resident threads
  for (int w = 0; w < 2; ++w) read_kernel<<<blocks, kThreads, 0, stream>>>(src, n_vec, sink);
  TETRA_CUDA_CHECK_LAUNCH("read probe");
  const std::vector<double> us =
      time_runs_us(stream, iters, [&](int) { read_kernel<<<blocks, kThreads, 0, stream>>>(src, n_vec, sink); });
  std::vector<double> tbps;
  for (double t : us) tbps.push_back(double(bytes) / (t * 1e-6) * 1e-12);
  std::sort(tbps.begin(), tbps.end());
  TETRA_CUDA_CHECK(cudaFree(owned.release()));
  ReadCeiling out;
  out.bytes = bytes;
  out.median_tbps = tbps[tbps.size() / 2];
  out.min_tbps = tbps.front();
  out.max_tbps = tbps.back();
  return out;
}

}  // namespace tetra::bench
