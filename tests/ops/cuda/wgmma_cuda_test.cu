// The wgmma building blocks (src/ops/cuda/wgmma.cuh) against a host matmul: both operands
// from 128-byte swizzled shared memory, B K-major (MLA's scores, S = Q K^T) and B MN-major
// (MLA's P V, V read in the layout of the key tile it shares with K), and the accumulator
// layout the kernels write out by. Small integers in BF16: every product and sum is exact, so
// the results must be equal.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/wgmma.cuh"

namespace tetra::ops::cuda {
namespace {

using testing_util::DevBuf;
using testing_util::have_gpu;

constexpr int kM = 64, kK = 64;          // A: 64 x 64, one 128-byte column block
constexpr int kAtomBytes = 64 * 128;      // a column block of 64 rows

// Copies a row-major [rows x cols] BF16 matrix into column blocks of 64 values, swizzled.
__device__ void to_swizzled(const uint16_t* src, int rows, int cols, uint8_t* dst) {
  for (int i = int(threadIdx.x); i < rows * cols / 8; i += int(blockDim.x)) {
    const int r = i / (cols / 8), u = i % (cols / 8);
    *reinterpret_cast<uint4*>(dst + (u / 8) * (rows * 128) + wgmma::swizzled(r, u % 8)) =
        *reinterpret_cast<const uint4*>(src + r * cols + 8 * u);
  }
}

__device__ uint32_t shared_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// The swizzle phase comes from the address: tiles start 1,024-byte aligned.
__device__ uint8_t* aligned_1024(uint8_t* p) { return p + ((1024u - (shared_addr(p) & 1023u)) & 1023u); }

// Writes accumulator d[64 x 2 * kAcc] row-major.
template <int kAcc>
__device__ void store_acc(const float (&d)[kAcc], float* out) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t4 = lane % 4;
  constexpr int kN = 2 * kAcc;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int row = 16 * warp + g + 8 * ((i / 2) & 1), col = 8 * (i / 4) + 2 * t4 + (i & 1);
    out[row * kN + col] = d[i];
  }
}

// D[64 x 64] = A[64 x 64] B^T, B given as [64 (N) x 64 (K)]: both K-major.
__global__ void scores_kernel(const uint16_t* a, const uint16_t* b, float* out) {
  __shared__ uint8_t smem[3 * kAtomBytes];
  uint8_t* sa = aligned_1024(smem);
  uint8_t* sb = sa + kAtomBytes;
  to_swizzled(a, kM, kK, sa);
  to_swizzled(b, 64, kK, sb);
  wgmma::fence_proxy_async();
  __syncthreads();
  float d[32] = {};
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    wgmma::mma_ss<0>(d, wgmma::desc_k_major(shared_addr(sa) + kk * 32), wgmma::desc_k_major(shared_addr(sb) + kk * 32));
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_acc(d);
  store_acc(d, out);
}

// D[64 x 256] = A[64 x 64 keys] V[64 keys x dims half*256 ..], V row-major [64 x 512]: B
// MN-major, its 64-dim column blocks kAtomBytes apart.
__global__ void values_kernel(const uint16_t* a, const uint16_t* v, int half, float* out) {
  extern __shared__ uint8_t smem[];
  uint8_t* sa = aligned_1024(smem);
  uint8_t* sv = smem + kAtomBytes;
  to_swizzled(a, kM, kK, sa);
  to_swizzled(v, 64, 512, sv);
  wgmma::fence_proxy_async();
  __syncthreads();
  float d[128] = {};
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    wgmma::mma_ss<1>(d, wgmma::desc_k_major(shared_addr(sa) + kk * 32),
                     wgmma::desc_mn_major(shared_addr(sv) + half * 4 * kAtomBytes + kk * 16 * 128, kAtomBytes));
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_acc(d);
  store_acc(d, out);
}

std::vector<uint16_t> small_ints(int n, uint32_t seed, std::vector<float>& as_float) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  as_float.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    as_float[size_t(i)] = float(d(rng));
    v[size_t(i)] = f32_to_bf16(as_float[size_t(i)]);
  }
  return v;
}

template <class T>
T* upload(DevBuf& buf, const std::vector<T>& host) {
  EXPECT_EQ(cudaMemcpy(buf.p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return buf.as<T>();
}

std::vector<float> download(const DevBuf& buf, size_t n) {
  std::vector<float> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), buf.p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(WgmmaCuda, KMajorScoresMatchHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<float> af, bf;
  const auto a = small_ints(kM * kK, 1, af), b = small_ints(64 * kK, 2, bf);
  DevBuf da(a.size() * 2), db(b.size() * 2), dout(size_t(kM) * 64 * 4);
  scores_kernel<<<1, 128>>>(upload(da, a), upload(db, b), dout.as<float>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = download(dout, size_t(kM) * 64);
  int wrong = 0;
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < 64; ++j) {
      float want = 0;
      for (int k = 0; k < kK; ++k) want += af[size_t(i * kK + k)] * bf[size_t(j * kK + k)];
      if (got[size_t(i * 64 + j)] != want && wrong++ < 5)
        ADD_FAILURE() << "S[" << i << "][" << j << "] = " << got[size_t(i * 64 + j)] << ", want " << want;
    }
  EXPECT_EQ(wrong, 0);
}

TEST(WgmmaCuda, MnMajorValuesMatchHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<float> af, vf;
  const auto a = small_ints(kM * kK, 3, af), v = small_ints(64 * 512, 4, vf);
  DevBuf da(a.size() * 2), dv(v.size() * 2), dout(size_t(kM) * 256 * 4);
  const int smem = 9 * kAtomBytes + 1024;
  ASSERT_EQ(cudaFuncSetAttribute(values_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  for (int half = 0; half < 2; ++half) {
    values_kernel<<<1, 128, smem>>>(upload(da, a), upload(dv, v), half, dout.as<float>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = download(dout, size_t(kM) * 256);
    int wrong = 0;
    for (int i = 0; i < kM; ++i)
      for (int j = 0; j < 256; ++j) {
        float want = 0;
        for (int k = 0; k < kK; ++k) want += af[size_t(i * kK + k)] * vf[size_t(k * 512 + half * 256 + j)];
        if (got[size_t(i * 256 + j)] != want && wrong++ < 5)
          ADD_FAILURE() << "half " << half << ": O[" << i << "][" << j << "] = " << got[size_t(i * 256 + j)]
                        << ", want " << want;
      }
    EXPECT_EQ(wrong, 0) << "half " << half;
  }
}

}  // namespace
}  // namespace tetra::ops::cuda
