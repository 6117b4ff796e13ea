#include "ops/cuda/peer_all_reduce.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/gpu_sync.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/norm_row.cuh"

namespace tetra::ops::cuda {
namespace {

// This block's launch number (after pdl_wait: the launch before wrote it).
__device__ __forceinline__ uint32_t next_epoch(const PeerGroup& g) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) {
    uint32_t* mine = &g.flags[g.rank]->epoch[blockIdx.x];
    epoch = *mine + 1;
    *mine = epoch;  // read again only by this block's next launch
  }
  __syncthreads();
  return epoch;
}

template <typename T>
__device__ __forceinline__ T* staging(const PeerGroup& g, int rank, uint32_t epoch) {
  return reinterpret_cast<T*>(static_cast<char*>(g.staging[rank]) + (epoch & 1) * g.half_bytes);
}

// This block's slice is in its staging: tells every other rank's block of the same index, then
// waits until each has said the same (a flag at or past `epoch`: a rank may already be a launch
// ahead). False, in every thread, when the group was aborted meanwhile.
__device__ bool exchange(const PeerGroup& g, uint32_t epoch) {
  __syncthreads();  // every thread's part of the slice is written
  bool aborted = false;
  const int peer = int(threadIdx.x);
  if (peer < g.size && peer != g.rank) {
    __threadfence_system();
    st_release_sys(&g.flags[peer]->flag[blockIdx.x][g.rank], epoch);
    const uint32_t* theirs = &g.flags[g.rank]->flag[blockIdx.x][peer];
    for (uint32_t spins = 1; int32_t(ld_acquire_sys(theirs) - epoch) < 0; ++spins)
      if (spins % 1024 == 0 && *g.abort) {  // mapped host memory: read now and then
        aborted = true;
        break;
      }
  }
  return !__syncthreads_or(aborted);
}

// Elements [lo, hi) of n, split into kPeerBlocks slices of whole vectors of kVec.
template <int kVec>
__device__ __forceinline__ void slice_of_block(int64_t n, int64_t& lo, int64_t& hi) {
  const int64_t vecs = (n + kVec - 1) / kVec;
  const int64_t per = (vecs + kPeerBlocks - 1) / kPeerBlocks * kVec;
  lo = std::min<int64_t>(n, blockIdx.x * per);
  hi = std::min<int64_t>(n, lo + per);
}

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Another rank's staging is read through L2 only: its lines are new to this launch.
template <typename V>
__device__ __forceinline__ V load_peer(const V* p) {
  static_assert(sizeof(V) == 16 || sizeof(V) == 8 || sizeof(V) == 4 || sizeof(V) == 2 || sizeof(V) == 1,
                "peer loads are of 1, 2, 4, 8 or 16 bytes");
  if constexpr (sizeof(V) == 16) {
    const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
    return *reinterpret_cast<const V*>(&u);
  } else if constexpr (sizeof(V) == 8) {
    const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p));
    return *reinterpret_cast<const V*>(&u);
  } else if constexpr (sizeof(V) == 4) {
    const unsigned u = __ldcg(reinterpret_cast<const unsigned*>(p));
    return *reinterpret_cast<const V*>(&u);
  } else if constexpr (sizeof(V) == 2) {
    const unsigned short u = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return *reinterpret_cast<const V*>(&u);
  } else {
    const unsigned char u = __ldcg(reinterpret_cast<const unsigned char*>(p));
    return *reinterpret_cast<const V*>(&u);
  }
}

// A thread's run of kPer values of T at p[i ..] (norm_row.cuh's row_value), in pieces of up to
// 16 bytes where the run is whole and aligned, else a value at a time; values at or past d read
// as zeros and are never written. kPeer: another rank's staging (load_peer).
template <typename T, int kPer>
struct Run {
  static constexpr int kBytes = kPer * int(sizeof(T)), kPieceBytes = kBytes < 16 ? kBytes : 16;
  static constexpr int kPieceValues = kPieceBytes / int(sizeof(T));
  using Piece = Vec<T, kPieceValues>;
  __device__ static bool whole(const T* p, int64_t i, int64_t d) {
    return i + kPer <= d && reinterpret_cast<uintptr_t>(p + i) % kPieceBytes == 0;
  }
};

template <typename T, int kPer, bool kPeer = false>
__device__ __forceinline__ void load_run(const T* p, int64_t i, int64_t d, T (&v)[kPer]) {
  using R = Run<T, kPer>;
  if (R::whole(p, i, d)) {
    const typename R::Piece* src = reinterpret_cast<const typename R::Piece*>(p + i);
#pragma unroll
    for (int k = 0; k < kPer / R::kPieceValues; ++k) {
      const typename R::Piece piece = kPeer ? load_peer(src + k) : src[k];
#pragma unroll
      for (int e = 0; e < R::kPieceValues; ++e) v[k * R::kPieceValues + e] = piece.v[e];
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = i + j < d ? (kPeer ? load_peer(p + i + j) : p[i + j]) : from_float<T>(0.0f);
}

template <typename T, int kPer>
__device__ __forceinline__ void store_run(T* p, int64_t i, int64_t d, const T (&v)[kPer]) {
  using R = Run<T, kPer>;
  if (R::whole(p, i, d)) {
    typename R::Piece* dst = reinterpret_cast<typename R::Piece*>(p + i);
#pragma unroll
    for (int k = 0; k < kPer / R::kPieceValues; ++k) {
      typename R::Piece piece;
#pragma unroll
      for (int e = 0; e < R::kPieceValues; ++e) piece.v[e] = v[k * R::kPieceValues + e];
      dst[k] = piece;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (i + j < d) p[i + j] = v[j];
}

// x [n] in place: x = sum over ranks, in rank order, of their x (n <= half_bytes / sizeof(T)).
template <typename T, int kVec>
__global__ void all_reduce_sum_kernel(PeerGroup g, T* x, int64_t n) {
  using V = Vec<T, kVec>;
  pdl_wait();
  const uint32_t epoch = next_epoch(g);
  int64_t lo, hi;
  slice_of_block<kVec>(n, lo, hi);
  V* mine = staging<V>(g, g.rank, epoch);
  V* xs = reinterpret_cast<V*>(x);
  for (int64_t i = lo / kVec + threadIdx.x; i < hi / kVec; i += blockDim.x) mine[i] = xs[i];
  if (!exchange(g, epoch)) return;
  pdl_launch_dependents();
  for (int64_t i = lo / kVec + threadIdx.x; i < hi / kVec; i += blockDim.x) {
    float acc[kVec] = {};
    for (int r = 0; r < g.size; ++r) {
      const V part = r == g.rank ? mine[i] : load_peer(staging<V>(g, r, epoch) + i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += to_float(part.v[k]);
    }
    V sum;
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum.v[k] = from_float<T>(acc[k]);
    xs[i] = sum;
  }
}

// out [size * n] = every rank's x [n] (n units of 16 bytes, or of one byte).
template <typename U>
__global__ void all_gather_kernel(PeerGroup g, const U* x, int64_t n, U* out) {
  pdl_wait();
  const uint32_t epoch = next_epoch(g);
  int64_t lo, hi;
  slice_of_block<1>(n, lo, hi);
  U* mine = staging<U>(g, g.rank, epoch);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i] = x[i];
  if (!exchange(g, epoch)) return;
  pdl_launch_dependents();
  for (int r = 0; r < g.size; ++r) {
    const U* src = staging<U>(g, r, epoch);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      out[r * n + i] = r == g.rank ? mine[i] : load_peer(src + i);
  }
}

// Rows of d values, row b on block b (rows <= kPeerBlocks): h += the rank-order sum of delta,
// out = rms_norm(h) * w, each thread holding kPer values of the row as norm.cu's norm_row_kernel
// does, so the sums of squares add in its order. A thread's loads are issued together before any
// of its stores: a store between them could alias the next load's address, which would leave
// every load to wait for the one before.
template <typename T, int kPer, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads)
    all_reduce_add_rms_norm_kernel(PeerGroup g, const T* __restrict__ delta, T* __restrict__ h, const void* w,
                                   DType wdt, float eps, void* out, DType odt, int64_t rows, int64_t d) {
  const int64_t i0 = row_value<kPer>(threadIdx.x, 0);
  float wv[kPer];  // the model's weight, fixed at load: read before the wait (launch.cuh)
  load_row_run<kPer>(w, i0, d, wdt, wv);
  pdl_wait();
  const uint32_t epoch = next_epoch(g);
  const bool has_row = blockIdx.x < rows;  // the same in every thread of the block
  const int64_t base = int64_t(blockIdx.x) * d;
  T own[kPer], h_own[kPer];
  if (has_row) {
    load_run<T, kPer>(delta + base, i0, d, own);
    load_run<T, kPer>(h + base, i0, d, h_own);
    store_run<T, kPer>(staging<T>(g, g.rank, epoch) + base, i0, d, own);
  }
  if (!exchange(g, epoch)) return;
  pdl_launch_dependents();
  if (!has_row) return;
  float acc[kPer] = {};
  for (int r = 0; r < g.size; ++r) {
    T part[kPer];
    if (r == g.rank) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) part[j] = own[j];
    } else {
      load_run<T, kPer, true>(staging<T>(g, r, epoch) + base, i0, d, part);
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) acc[j] += to_float(part[j]);
  }
  const DType hdt = sizeof(T) == 2 ? DType::BF16 : DType::F32;
  float v[kPer];
  T h_new[kPer];
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    v[j] = 0.0f;
    if (i0 + j < d) {
      const float sum = to_float(from_float<T>(acc[j]));       // what the all-reduce stores
      v[j] = round_to(hdt, to_float(h_own[j]) + sum);          // what add_rms_norm stores
    }
    h_new[j] = from_float<T>(v[j]);
    sq += v[j] * v[j];
  }
  store_run<T, kPer>(h + base, i0, d, h_new);
  __shared__ float partial[kRowThreads / 32];
  const float inv = rsqrtf(block_sum<kRowThreads>(sq, partial) / float(d) + eps);
  float y[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) y[j] = wv[j] * (v[j] * inv);
  store_row_run<kPer>(out, base + i0, base + d, odt, y);
}

constexpr int kThreads = 512;

void check_group(const PeerGroup& g, const char* op) {
  TETRA_CHECK(g.size >= 1 && g.size <= kMaxPeerRanks && g.rank >= 0 && g.rank < g.size && g.half_bytes > 0 &&
                  g.abort != nullptr,
              op, ": the peer group is not set up");
  for (int r = 0; r < g.size; ++r)
    TETRA_CHECK(g.flags[r] && g.staging[r], op, ": rank ", r, "'s flags or staging is missing");
}

template <typename T>
void launch_sum(const KernelLaunch& launch, const PeerGroup& g, T* x, int64_t n) {
  constexpr int kVec = 16 / sizeof(T);  // 16-byte vectors where x allows them
  if (aligned16(x) && n % kVec == 0)
    launch_kernel(launch, all_reduce_sum_kernel<T, kVec>, kPeerBlocks, kThreads, 0, g, x, n);
  else
    launch_kernel(launch, all_reduce_sum_kernel<T, 1>, kPeerBlocks, kThreads, 0, g, x, n);
}

template <typename T>
void launch_norm(const KernelLaunch& launch, const PeerGroup& g, TensorView delta, TensorView h, TensorView weight,
                 float eps, TensorView out, int64_t rows, int64_t d) {
  with_row_layout(d, [&]<int kPer, int kRowThreads>() {
    launch_kernel(launch, all_reduce_add_rms_norm_kernel<T, kPer, kRowThreads>, kPeerBlocks, kRowThreads, 0, g,
                  static_cast<const T*>(delta.data), static_cast<T*>(h.data), weight.data, weight.dtype, eps,
                  out.data, out.dtype, rows, d);
  });
}

}  // namespace

void load_peer_kernels() {
  cudaFuncAttributes a{};
  auto load = [&](auto kernel) { TETRA_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel)); };
  load(all_reduce_sum_kernel<float, 4>);
  load(all_reduce_sum_kernel<float, 1>);
  load(all_reduce_sum_kernel<__nv_bfloat16, 8>);
  load(all_reduce_sum_kernel<__nv_bfloat16, 1>);
  load(all_gather_kernel<uint4>);
  load(all_gather_kernel<uint8_t>);
  for (int64_t d : {4 * 256, 8 * 256, 8 * 512, 8 * 1024})  // each row layout once
    with_row_layout(d, [&]<int kPer, int kRowThreads>() {
      load(all_reduce_add_rms_norm_kernel<float, kPer, kRowThreads>);
      load(all_reduce_add_rms_norm_kernel<__nv_bfloat16, kPer, kRowThreads>);
    });
}

void peer_all_reduce_sum(const KernelLaunch& launch, const PeerGroup& g, TensorView x) {
  check_group(g, "all_reduce_sum");
  TETRA_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "all_reduce_sum: ", dtype_name(x.dtype),
              " tensors are not summed (F32 or BF16)");
  TETRA_CHECK(x.empty() || x.device == Device::Cuda, "all_reduce_sum: x is not on the GPU");
  const int64_t n = x.numel();
  if (n == 0) return;
  TETRA_CHECK(x.nbytes() <= g.half_bytes, "all_reduce_sum: ", x.nbytes(), " bytes is more than the ", g.half_bytes,
              " a staging half holds (the communicator splits larger messages)");
  if (x.dtype == DType::F32) launch_sum(launch, g, static_cast<float*>(x.data), n);
  else launch_sum(launch, g, static_cast<__nv_bfloat16*>(x.data), n);
  TETRA_CUDA_CHECK_LAUNCH("peer all_reduce_sum");
}

void peer_all_gather(const KernelLaunch& launch, const PeerGroup& g, TensorView x, TensorView out) {
  check_group(g, "all_gather");
  TETRA_CHECK(out.dtype == x.dtype && out.numel() == x.numel() * g.size, "all_gather: out is ",
              dtype_name(out.dtype), " of ", out.numel(), " elements, not ", dtype_name(x.dtype), " of ", g.size,
              " x ", x.numel());
  TETRA_CHECK(x.empty() || (x.device == Device::Cuda && out.device == Device::Cuda),
              "all_gather: x and out must be on the GPU");
  const int64_t bytes = x.nbytes();
  if (bytes == 0) return;
  // One launch gathers the whole message (the models gather nothing larger than a step's ids).
  TETRA_CHECK(bytes <= g.half_bytes, "all_gather: ", bytes, " bytes a rank is more than the ", g.half_bytes,
              " the peer staging holds");
  const bool words = aligned16(x.data) && aligned16(out.data) && bytes % 16 == 0;
  if (words)
    launch_kernel(launch, all_gather_kernel<uint4>, kPeerBlocks, kThreads, 0, g, static_cast<const uint4*>(x.data),
                  bytes / 16, static_cast<uint4*>(out.data));
  else
    launch_kernel(launch, all_gather_kernel<uint8_t>, kPeerBlocks, kThreads, 0, g,
                  static_cast<const uint8_t*>(x.data), bytes, static_cast<uint8_t*>(out.data));
  TETRA_CUDA_CHECK_LAUNCH("peer all_gather");
}

bool peer_add_rms_norm_takes(int64_t rows, int64_t d, DType dtype, const PeerGroup& g) {
  const int64_t elem = dtype == DType::BF16 ? 2 : dtype == DType::F32 ? 4 : 0;
  return elem > 0 && rows <= kPeerBlocks && d >= 512 && d <= 8 * 1024 && rows * d * elem <= g.half_bytes;
}

void peer_all_reduce_add_rms_norm(const KernelLaunch& launch, const PeerGroup& g, TensorView delta, TensorView h,
                                  TensorView weight, float eps, TensorView out) {
  check_group(g, "all_reduce_add_rms_norm");
  const int64_t d = h.empty() ? 0 : h.dim(-1), rows = d ? h.numel() / d : 0;
  TETRA_CHECK(peer_add_rms_norm_takes(rows, d, h.dtype, g), "all_reduce_add_rms_norm: ", rows, " rows of ", d, " ",
              dtype_name(h.dtype), " values are not taken (BF16 or F32, 512 to 8192 a row, up to ", kPeerBlocks,
              " rows)");
  TETRA_CHECK(delta.numel() == h.numel() && delta.dtype == h.dtype && out.numel() == h.numel() &&
                  weight.numel() == d && out.data != h.data && out.data != delta.data,
              "all_reduce_add_rms_norm: delta, h and out must be alike in size, delta and h in dtype, the weight a "
              "row long, and out a third tensor");
  TETRA_CHECK(h.device == Device::Cuda && delta.device == Device::Cuda && out.device == Device::Cuda,
              "all_reduce_add_rms_norm: the tensors must be on the GPU");
  if (rows == 0) return;
  if (h.dtype == DType::F32) launch_norm<float>(launch, g, delta, h, weight, eps, out, rows, d);
  else launch_norm<__nv_bfloat16>(launch, g, delta, h, weight, eps, out, rows, d);
  TETRA_CUDA_CHECK_LAUNCH("peer all_reduce_add_rms_norm");
}

}  // namespace tetra::ops::cuda
