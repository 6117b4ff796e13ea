// The DSA key choice (the indexer of glm_moe_dsa) on sm_90a; see attention_mla.h.
//
// A scores kernel writes each token's score of every cached index key to the workspace: on
// mma.sync for the 32-heads-of-128 and 8-of-32 indexers, else a thread per key with the token's
// queries in shared memory. Then a radix select on the scores' order-preserving bit patterns in
// two stages: a block per slice of 16,384 keys keeps the slice's top_k, and a block per token
// takes the top_k of those survivors, written in ascending position order. E4M3 index keys (an
// FP8 cache) are widened to BF16 as they are read, exactly.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cmath>

#include "ops/cuda/attention_mla.h"
#include "ops/cuda/attention_mla_internal.cuh"  // sequence_of, cache_slot
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_sync.cuh"

namespace tetra::ops::cuda {
namespace {

using namespace mla;

constexpr int kScoreThreads = 256;  // keys per scores block
constexpr int kMaxIndexHeads = 64;
constexpr int kSelectThreads = 1024;
constexpr int kSliceKeys = 16384;  // keys a stage-1 block selects among
constexpr int kMaxSlices = 1024;
constexpr int64_t kScoreWorkspaceBytes = int64_t(64) << 20;  // scores and survivors of one group of tokens

struct DsaArgs {
  DsaSelectParams p;
  int key_cap;       // max_blocks_per_seq * block_size: the longest row of scores
  int token0;        // the group's first token
  float* scores;     // [group tokens, key_cap]
  // Stage 1's survivors, [group tokens, slices, top_k] each, and how many per slice.
  float* survivor_score;
  int32_t* survivor_pos;
  int32_t* survivor_count;
};

// Values 8 chunk .. 8 chunk + 7 of the index key in `slot`, as 8 BF16 values: E4M3 keys (an FP8
// cache) widen exactly.
template <bool kFp8>
__device__ __forceinline__ uint4 index_key_chunk(const DsaSelectParams& p, int64_t slot, int chunk) {
  const int64_t at = slot * p.dim + 8 * int64_t(chunk);
  if constexpr (kFp8) return widen_e4m3x8(*reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.index_k) + at));
  else return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.index_k) + at);
}

// A thread per key: its index key in registers, 8 dims at a time, against every head's query
// (shared memory; all threads read the same element, a broadcast). Sums in the CPU's order:
// each head's dot over the dims in turn, then the heads in turn.
template <bool kFp8>
__global__ void __launch_bounds__(kScoreThreads) dsa_scores_kernel(const DsaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float q_smem[];  // [n_heads, dim], then the heads' weights
  const DsaSelectParams& p = a.p;
  const int token = a.token0 + int(blockIdx.y);
  const int n_keys = min(p.positions[token] + 1, a.key_cap);
  const int key0 = int(blockIdx.x) * kScoreThreads;
  if (key0 >= n_keys) return;
  float* w_smem = q_smem + p.n_heads * p.dim;
  for (int i = int(threadIdx.x); i < p.n_heads * p.dim; i += kScoreThreads)
    q_smem[i] = bf16_to_float(p.q[int64_t(token) * p.n_heads * p.dim + i]);
  for (int h = int(threadIdx.x); h < p.n_heads; h += kScoreThreads)
    w_smem[h] = p.weights[int64_t(token) * p.n_heads + h] * p.weight_scale;
  __syncthreads();
  const int key = key0 + int(threadIdx.x);
  if (key >= n_keys) return;
  const int seq = sequence_of(p.seq_starts, p.n_seqs, token);
  const int64_t slot = cache_slot(p.block_tables, p.max_blocks_per_seq, p.block_size, seq, key);
  float dot[kMaxIndexHeads];
#pragma unroll
  for (int h = 0; h < kMaxIndexHeads; ++h) dot[h] = 0.0f;
  for (int d0 = 0; d0 < p.dim; d0 += 8) {
    const uint4 raw = index_key_chunk<kFp8>(p, slot, d0 / 8);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    float kv[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      kv[2 * j] = __uint_as_float(words[j] << 16);
      kv[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    }
#pragma unroll
    for (int h = 0; h < kMaxIndexHeads; ++h) {
      if (h >= p.n_heads) break;
      const float* qh = q_smem + h * p.dim + d0;
#pragma unroll
      for (int j = 0; j < 8; ++j) dot[h] += qh[j] * kv[j];
    }
  }
  float score = 0.0f;
#pragma unroll
  for (int h = 0; h < kMaxIndexHeads; ++h)
    if (h < p.n_heads) score += fmaxf(0.0f, dot[h] * p.q_scale) * w_smem[h];
  a.scores[int64_t(blockIdx.y) * a.key_cap + key] = score;
}

// The same scores on the tensor cores, for up to 8 kNTiles heads and 16 kKSteps dims (GLM-5:
// 32 heads of 128). A warp takes 16 keys at a time, kScoreThreads / 4 a warp, as the A operand
// of m16n8k16 (keys x dims) against Q as B (dims x heads), whose fragments stay in registers for
// the block. The dims of a k-step are permuted alike in A and B (thread t4 holds the 16-byte
// chunks t4, t4 + 4, ... of each row, two k-steps a chunk), so each row is read in whole 16-byte
// pieces; a dot product does not care in which order its dims come. Each thread then sums its
// 2 heads of every n-tile, relu'd and weighted, and the quad adds its 4 partial sums: a sum in
// another order than the CPU's, so scores differ from it by f32 roundings.
template <int kNTiles, int kKSteps, bool kFp8>
__global__ void __launch_bounds__(128) dsa_scores_mma_kernel(const DsaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kChunks = kKSteps / 2;  // 16-byte chunks a thread holds of a row
  constexpr int kGroups = kScoreThreads / 4 / 16;
  const DsaSelectParams& p = a.p;
  const int token = a.token0 + int(blockIdx.y);
  const int n_keys = min(p.positions[token] + 1, a.key_cap);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t4 = lane % 4;
  const int key0 = int(blockIdx.x) * kScoreThreads + warp * (kScoreThreads / 4);
  if (key0 >= n_keys) return;
  uint4 qv[kNTiles][kChunks];
  float w[kNTiles][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const int head = nt * 8 + g;
    const uint4* q = reinterpret_cast<const uint4*>(p.q + (int64_t(token) * p.n_heads + head) * p.dim);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) qv[nt][j] = head < p.n_heads ? q[t4 + 4 * j] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = nt * 8 + 2 * t4 + e;
      w[nt][e] = h < p.n_heads ? p.weights[int64_t(token) * p.n_heads + h] * p.weight_scale : 0.0f;
    }
  }
  const int seq = sequence_of(p.seq_starts, p.n_seqs, token);
  float* out = a.scores + int64_t(blockIdx.y) * a.key_cap;
#pragma unroll 1
  for (int grp = 0; grp < kGroups; ++grp) {
    const int base = key0 + grp * 16;
    if (base >= n_keys) break;
    uint4 kv[2][kChunks];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = base + g + 8 * r;
      const bool valid = key < n_keys;
      const int64_t slot = valid ? cache_slot(p.block_tables, p.max_blocks_per_seq, p.block_size, seq, key) : 0;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) kv[r][j] = valid ? index_key_chunk<kFp8>(p, slot, t4 + 4 * j) : make_uint4(0, 0, 0, 0);
    }
    float d[kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t a_frag[4] = {word(kv[0][j], 2 * e), word(kv[1][j], 2 * e), word(kv[0][j], 2 * e + 1),
                                    word(kv[1][j], 2 * e + 1)};
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          mma_bf16_16x8x16(d[nt], a_frag, word(qv[nt][j], 2 * e), word(qv[nt][j], 2 * e + 1));
      }
    float score[2] = {0.0f, 0.0f};  // keys g and g + 8
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) score[r] += fmaxf(0.0f, d[nt][2 * r + e] * p.q_scale) * w[nt][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      score[r] = quad_sum(score[r]);
      const int key = base + g + 8 * r;
      if (t4 == r && key < n_keys) out[key] = score[r];
    }
  }
}

// Larger floats give larger keys (negative ones flipped whole, positive ones above them).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

// Stage 1 reads a slice of a token's scores; stage 2 the slices' survivors, slice c's
// count[c] of them at c * top_k, indexed as if packed end to end: in both, index order is
// position order.
struct ScoreSlice {
  const float* scores;
  int begin, end;
  __device__ int size() const { return end - begin; }
  __device__ float score(int i) const { return scores[begin + i]; }
  __device__ int32_t position(int i) const { return begin + i; }
};
struct Survivors {
  const float* scores;
  const int32_t* positions;
  const int* starts;  // [n_slices + 1]: where each slice's survivors begin, packed (shared memory)
  int top_k, n_slices;
  __device__ int size() const { return starts[n_slices]; }
  __device__ int at(int i) const {
    int c = 0;
    while (starts[c + 1] <= i) ++c;
    return c * top_k + (i - starts[c]);
  }
  __device__ float score(int i) const { return scores[at(i)]; }
  __device__ int32_t position(int i) const { return positions[at(i)]; }
};

// Keys a thread of block_top_k holds in registers (key j = c * kSelectThreads + tid in slot
// c) when the block's keys are no more than kSliceKeys: they are read once, not once a pass.
constexpr int kKeysPerThread = kSliceKeys / kSelectThreads;
static_assert(kSliceKeys % kSelectThreads == 0, "a slice's keys divide over the block's threads");

// The digit of this pass where the count from the top reaches the keys still wanted, found by
// warp 0: lane l holds digits 255 - 8l down to 248 - 8l, a scan gives the keys above its own.
// With fewer keys than wanted the last lane takes digit 0, and then all of them are taken.
__device__ __forceinline__ void find_digit(const int* histogram, uint32_t prefix, int shift, int& remaining,
                                           uint32_t& next_prefix) {
  const int lane = int(threadIdx.x), wanted = remaining;
  int count[8], sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += (count[i] = histogram[255 - 8 * lane - i]);
  int upto = sum;  // keys at this lane's digits and above
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, upto, o);
    if (lane >= o) upto += v;
  }
  const int total = __shfl_sync(0xffffffffu, upto, 31);
  int above = upto - sum;
  if ((above < wanted && wanted <= upto) || (lane == 31 && total < wanted)) {
    int i = 0;
    for (; i < 7 && above + count[i] < wanted; ++i) above += count[i];
    remaining = wanted - above;
    next_prefix = prefix | (uint32_t(255 - 8 * lane - i) << shift);
  }
}

// The block's top_k of `src` (score first, then the lower position), written in index order:
// positions to out_pos, scores to out_score (when given); returns how many (all of them when
// there are no more than top_k). A radix select, 8 bits a pass from the top, finds the top_k-th
// largest key; then the keys above it and the first of its ties are written, placed by a
// block-wide scan. kInRegisters: src has at most kSliceKeys keys.
template <bool kInRegisters, class Src>
__device__ int block_top_k(const Src& src, int top_k, int32_t* out_pos, float* out_score) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int histogram[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_chunk_total;
  const int tid = int(threadIdx.x), n = src.size();
  uint32_t keys[kInRegisters ? kKeysPerThread : 1];
  if constexpr (kInRegisters) {
#pragma unroll
    for (int c = 0; c < kKeysPerThread; ++c) {
      const int j = c * kSelectThreads + tid;
      keys[c] = j < n ? order_key(src.score(j)) : 0u;
    }
  }
  // f(j, key) for each of the thread's keys, in index order.
  const auto for_each_key = [&](auto&& f) {
    if constexpr (kInRegisters) {
#pragma unroll
      for (int c = 0; c < kKeysPerThread; ++c)
        if (c * kSelectThreads + tid < n) f(keys[c]);
    } else {
      for (int j = tid; j < n; j += kSelectThreads) f(order_key(src.score(j)));
    }
  };
  uint32_t prefix = 0, mask = 0;
  if (tid == 0) s_remaining = top_k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kSelectThreads) histogram[i] = 0;
    __syncthreads();
    // Scores bunch in a few top bytes, and every thread adding 1 to the same bin serializes:
    // a thread counts a run of its keys with one digit and adds the run once.
    int run_digit = -1, run = 0;
    for_each_key([&](uint32_t k) {
      if ((k & mask) != prefix) return;
      const int digit = int((k >> shift) & 0xff);
      if (digit == run_digit) {
        ++run;
        return;
      }
      if (run > 0) atomicAdd(&histogram[run_digit], run);
      run_digit = digit;
      run = 1;
    });
    if (run > 0) atomicAdd(&histogram[run_digit], run);
    __syncthreads();
    if (tid < 32) find_digit(histogram, prefix, shift, s_remaining, s_prefix);
    __syncthreads();
    prefix = s_prefix;
    mask |= 0xffu << shift;
  }
  const uint32_t threshold = prefix;
  const int ties_wanted = s_remaining;
  // The scan counts both kinds in one int: above in the low 16 bits, ties in the high ones.
  int written = 0, ties_seen = 0;
  const auto write_chunk = [&](int base, uint32_t k) {
    const int j = base + tid;
    const bool valid = j < n;
    const int above = valid && k > threshold, tie = valid && k == threshold;
    int before = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(above | (tie << 16), before, total);
    const int ties_before = ties_seen + (before >> 16);
    if (above || (tie && ties_before < ties_wanted)) {
      const int at = written + (before & 0xffff) + min(before >> 16, max(0, ties_wanted - ties_seen));
      out_pos[at] = src.position(j);
      if (out_score) out_score[at] = src.score(j);
    }
    if (tid == 0) s_chunk_total = total;
    __syncthreads();
    const int chunk_total = s_chunk_total;
    written += (chunk_total & 0xffff) + min(chunk_total >> 16, max(0, ties_wanted - ties_seen));
    ties_seen += chunk_total >> 16;
    __syncthreads();  // the scan storage and s_chunk_total are reused
  };
  if constexpr (kInRegisters) {
#pragma unroll
    for (int c = 0; c < kKeysPerThread; ++c)
      if (c * kSelectThreads < n) write_chunk(c * kSelectThreads, keys[c]);
  } else {
    for (int base = 0; base < n; base += kSelectThreads) {
      const int j = base + tid;
      write_chunk(base, j < n ? order_key(src.score(j)) : 0u);
    }
  }
  return written;
}

// Stage 1, a block per (slice of kSliceKeys keys, token): the slice's top_k survive. A token's
// global top_k is among its slices' (a key beaten by top_k others in its slice is beaten by
// them overall). Slices past the token's keys survive nothing.
__global__ void __launch_bounds__(kSelectThreads) dsa_slice_top_k_kernel(const DsaArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = int(blockIdx.y), slice = int(blockIdx.x), n_slices = int(gridDim.x);
  const int n_keys = min(a.p.positions[a.token0 + t] + 1, a.key_cap);
  const int64_t row = int64_t(t) * n_slices + slice;
  const ScoreSlice src{a.scores + int64_t(t) * a.key_cap, min(slice * kSliceKeys, n_keys),
                       min((slice + 1) * kSliceKeys, n_keys)};
  const int n =
      block_top_k<true>(src, a.p.top_k, a.survivor_pos + row * a.p.top_k, a.survivor_score + row * a.p.top_k);
  if (threadIdx.x == 0) a.survivor_count[row] = n;
}

// Stage 2, a block per token: the top_k of its slices' survivors, then -1s. No more survivors
// than top_k (a context of one slice, or under top_k keys): they are the answer, in order.
__global__ void __launch_bounds__(kSelectThreads) dsa_final_top_k_kernel(const DsaArgs a, int n_slices) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ int starts[kMaxSlices + 1];
  const int t = int(blockIdx.x), token = a.token0 + t;
  const int64_t first = int64_t(t) * n_slices;
  if (threadIdx.x == 0) {
    starts[0] = 0;
    for (int c = 0; c < n_slices; ++c) starts[c + 1] = starts[c] + a.survivor_count[first + c];
  }
  __syncthreads();
  const Survivors src{a.survivor_score + first * a.p.top_k, a.survivor_pos + first * a.p.top_k, starts, a.p.top_k,
                      n_slices};
  int32_t* out = a.p.selected + int64_t(token) * a.p.top_k;
  int n = src.size();
  if (n <= a.p.top_k) {
    for (int j = int(threadIdx.x); j < n; j += kSelectThreads) out[j] = src.position(j);
  } else if (n <= kSliceKeys) {  // up to 8 slices of GLM-5's 2,048 (128k keys)
    n = block_top_k<true>(src, a.p.top_k, out, nullptr);
  } else {
    n = block_top_k<false>(src, a.p.top_k, out, nullptr);
  }
  for (int j = n + int(threadIdx.x); j < a.p.top_k; j += kSelectThreads) out[j] = -1;
}

}  // namespace

namespace {
// What one token takes of the workspace: its scores, and its slices' survivors (score, position)
// with their counts.
struct DsaLayout {
  int64_t cap, n_slices, token_bytes;
  int group;  // tokens scored and selected at a time
};

DsaLayout dsa_layout(const DsaSelectParams& p) {
  DsaLayout l;
  // A step's tokens have at most max_seq_len keys: a prompt of 8,192 tokens under a table row
  // of GLM-5's 202,752 would otherwise launch 25 times the blocks and fit 25 times fewer tokens
  // in a group of the workspace (docs/PERF.md).
  l.cap = int64_t(p.max_blocks_per_seq) * p.block_size;
  if (p.max_seq_len > 0) l.cap = std::min<int64_t>(l.cap, p.max_seq_len);
  l.n_slices = ceil_div(l.cap, kSliceKeys);
  l.token_bytes = ceil_div(l.cap * 4 + l.n_slices * (int64_t(p.top_k) * 8 + 4), 16) * 16;
  l.group = int(std::clamp<int64_t>(kScoreWorkspaceBytes / l.token_bytes, 1, std::max(p.n_tokens, 1)));
  return l;
}
}  // namespace

int64_t dsa_select_workspace_bytes(const DsaSelectParams& p) {
  if (p.n_tokens == 0) return 0;
  const DsaLayout l = dsa_layout(p);
  return int64_t(l.group) * l.token_bytes;
}

void dsa_select(const KernelLaunch& launch, const DsaSelectParams& p, void* workspace, int64_t workspace_size) {
  if (p.n_tokens == 0) return;
  TETRA_CHECK(p.n_heads >= 1 && p.n_heads <= kMaxIndexHeads, "dsa_select: ", p.n_heads,
              " index heads; the CUDA kernel takes 1..", kMaxIndexHeads);
  TETRA_CHECK(p.dim >= 8 && p.dim % 8 == 0 && aligned16(p.index_k),
              "dsa_select: index keys of ", p.dim, " values must be whole rows of 8-value chunks");
  TETRA_CHECK(p.top_k >= 1 && p.top_k <= kSliceKeys && p.n_seqs >= 1 && p.block_size >= 1 &&
                  p.max_blocks_per_seq >= 1,
              "dsa_select: top_k ", p.top_k, " (at most ", kSliceKeys, "), ", p.n_seqs, " sequences");
  TETRA_CHECK(p.q && p.weights && p.index_k && p.selected && p.positions && p.seq_starts && p.block_tables,
              "dsa_select: a tensor pointer is null");
  const DsaLayout l = dsa_layout(p);
  TETRA_CHECK(l.cap <= INT_MAX && l.n_slices <= kMaxSlices, "dsa_select: a context of ", l.cap, " keys is too long");
  const int64_t need = int64_t(l.group) * l.token_bytes;
  TETRA_CHECK(workspace && workspace_size >= need && aligned16(workspace), "dsa_select: needs ", need,
              " bytes of 16-byte aligned workspace, got ", workspace_size);
  const int smem = (p.n_heads * p.dim + p.n_heads) * int(sizeof(float));
  TETRA_CHECK(smem <= 48 * 1024, "dsa_select: ", p.n_heads, " heads of ", p.dim, " values do not fit shared memory");
  // The group's scores, then its survivors: scores, positions, counts.
  auto* base = static_cast<uint8_t*>(workspace);
  const int64_t survivors = int64_t(l.group) * l.n_slices * p.top_k;
  DsaArgs a{p, int(l.cap), 0, reinterpret_cast<float*>(base), nullptr, nullptr, nullptr};
  a.survivor_score = reinterpret_cast<float*>(base + int64_t(l.group) * l.cap * 4);
  a.survivor_pos = reinterpret_cast<int32_t*>(a.survivor_score + survivors);
  a.survivor_count = a.survivor_pos + survivors;
  // The tensor-core scores for GLM-5's indexer (32 heads of 128 dims) and the small fixtures'
  // indexers (8 heads of 32); a thread a key on the CUDA cores otherwise.
  void (*scores_mma)(DsaArgs) = nullptr;
  if (aligned16(p.q) && p.n_heads > 24 && p.n_heads <= 32 && p.dim == 128)
    scores_mma = p.fp8_keys ? dsa_scores_mma_kernel<4, 8, true> : dsa_scores_mma_kernel<4, 8, false>;
  if (aligned16(p.q) && p.n_heads <= 8 && p.dim == 32)
    scores_mma = p.fp8_keys ? dsa_scores_mma_kernel<1, 2, true> : dsa_scores_mma_kernel<1, 2, false>;
  for (int t0 = 0; t0 < p.n_tokens; t0 += l.group) {
    const int n = std::min(l.group, p.n_tokens - t0);
    a.token0 = t0;
    const dim3 grid(unsigned(ceil_div(l.cap, kScoreThreads)), unsigned(n));
    if (scores_mma) {
      launch_kernel(launch, scores_mma, grid, 128, 0, a);
    } else {
      launch_kernel(launch, p.fp8_keys ? dsa_scores_kernel<true> : dsa_scores_kernel<false>, grid, kScoreThreads,
                    smem, a);
    }
    TETRA_CUDA_CHECK_LAUNCH("dsa_select scores");
    launch_kernel(launch, dsa_slice_top_k_kernel, dim3(unsigned(l.n_slices), unsigned(n)), kSelectThreads, 0, a);
    TETRA_CUDA_CHECK_LAUNCH("dsa_select slice top-k");
    launch_kernel(launch, dsa_final_top_k_kernel, unsigned(n), kSelectThreads, 0, a, int(l.n_slices));
    TETRA_CUDA_CHECK_LAUNCH("dsa_select top-k");
  }
}

}  // namespace tetra::ops::cuda
