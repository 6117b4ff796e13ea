// The sampling rule (ops/cpu/sampling.h) on the GPU: one block of 1024 threads per row, blocks
// striding over the rows, every threshold found by radix select so nothing is sorted. Weights
// and masses come from the CPU reference's own functions (exp_nonpositive, token_mass, integer
// masses), and every reduction is over integers or in a fixed order, so the kernel is
// deterministic and picks the CPU's token bit for bit.
//
// Passes over a row (each streams it from global memory in tiles of 4096 ids):
//   1. raw logits: max, first argmax and an online sum of e^(l - max) (the log-sum-exp); a row
//      with penalties is copied into its block's workspace slot, the penalties are scattered
//      into the copy, and 2. a second pass takes max and first argmax of the copy z.
//      Greedy rows stop here.
//   3. top_k < V: theta_k = the top_k-th largest key of z by radix select (4 passes of 8-bit
//      digits, shared histograms of counts).
//   4. top_p < 1: theta_p by radix select over C = { z >= theta_k } with histograms of mass
//      (4 passes; the first one's total is C's mass, from which the needed mass follows).
//   5. the draw: one pass adds the mass of N = { z >= theta } per tile; one warp finds the tile
//      where the running mass passes u * mass(N); the block scans that tile in id order.
//   6. n_top_logprobs > 0: radix select of the n-th largest raw key (4 passes), a gather pass,
//      and, only when more ties sit at the threshold than are needed, an ordered scan for the
//      lowest ids among them.
#include "ops/cuda/sampling.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/philox.h"
#include "ops/cpu/sampling.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

namespace rule = ::tetra::ops::sampling;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 4;                  // loads in flight per thread in a pass
constexpr int kTile = kThreads * kPerThread;   // ids per pass iteration; the draw searches tiles
constexpr int kMaxTiles = int(kSampleMaxVocab / kTile);
constexpr int kBins = 256;                     // 8-bit radix digits
constexpr int kNoBin = kBins;                  // a lane with no element to count
// Blocks (and workspace slots) at most: more than any GPU keeps resident at one 1024-thread
// block per SM, so rows never wait for a slot they could otherwise run in.
constexpr int kMaxBlocks = 512;
constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kBins == 8 * 32 && kMaxTiles == 8 * 32, "one warp scans bins and tiles, 8 per lane");
static_assert(kThreads == 32 * 32, "block reductions finish in one warp of warp totals");

struct SampleParams {
  const float* logits;  // [n_rows, vocab]
  int n_rows, vocab;
  const SamplingRow* rows;
  const int32_t* penalty_ids;
  const int32_t* penalty_counts;
  int n_penalties;
  SampledToken* out;
  float* scratch;       // [gridDim.x, vocab]: a block's copy of its penalized row
};

// Running max, its first index, and sum e^(x - max) over the elements seen.
struct RowStats {
  float max;
  int arg;
  float sum;
};

struct Selection {
  uint32_t key;                // the selected key
  unsigned long long above;    // weight of the participating keys above it
  unsigned long long at;       // weight of those equal to it
};

// 64-bit counters in shared memory as two 32-bit words. A 64-bit shared atomic add compiles
// to a compare-and-swap loop (ATOMS.CAST.SPIN.64 on sm_90) that spins under contention; two
// native 32-bit adds with the carry passed on are exact in any order.
template <int kSize>
struct WideCounters {
  unsigned low[kSize];
  unsigned high[kSize];

  __device__ void clear() {
    for (int i = int(threadIdx.x); i < kSize; i += kThreads) low[i] = high[i] = 0;
  }
  __device__ void add(int i, unsigned long long v) {
    const unsigned v_low = unsigned(v), old = atomicAdd(&low[i], v_low);
    const unsigned v_high = unsigned(v >> 32) + (old + v_low < old ? 1u : 0u);
    if (v_high) atomicAdd(&high[i], v_high);
  }
  // Once the adds are done (after a barrier).
  __device__ unsigned long long operator[](int i) const { return (unsigned long long)high[i] << 32 | low[i]; }
};

struct RowShared {
  WideCounters<kBins> bins;             // radix histogram: counts or masses
  WideCounters<kMaxTiles> tile_mass;
  unsigned long long warp_total[kWarps];
  RowStats warp_stats[kWarps];
  Selection selection;
  unsigned long long select_target;
  uint32_t top_key[kMaxTopLogprobs];
  int top_id[kMaxTopLogprobs];
  int top_count;
  int ties_taken;
  int last_kept_id;
  int draw_tile;
  unsigned long long draw_before;       // mass of N in the tiles before draw_tile
  unsigned long long draw_target;
  int token;
};

__device__ __forceinline__ int lane_id() { return int(threadIdx.x & 31); }

// --- keys, weights and per-lane work -----------------------------------------------------

// An order-preserving uint32 of a float: a < b iff key(a) < key(b). -0 takes +0's key since
// the two compare equal.
__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Calls f(id, value, valid) for every id of the row, tile by tile; thread t holds ids
// base + u * kThreads + t, so loads coalesce. Every lane runs every iteration (warp-wide
// intrinsics inside f stay converged); `valid` is false past the row's end.
template <typename F>
__device__ __forceinline__ void for_each_id(const float* x, int n, F&& f) {
  for (int base = 0; base < n; base += kTile) {
    float v[kPerThread];
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int i = base + u * kThreads + int(threadIdx.x);
      v[u] = i < n ? x[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int i = base + u * kThreads + int(threadIdx.x);
      f(i, v[u], i < n);
    }
  }
}

// Adds to bins[bin] each participating lane's weight: 1 when counting, else weight_of(v)
// (< 2^41), which runs only in warps holding a participant. Lanes of one bin are combined
// first (match, then popc for counts or a 32-bit reduce of each 20-bit half of a mass, which
// cannot overflow over 32 lanes), so one atomic per bin and warp reaches shared memory: nearby
// floats share leading digits, and atomics one per lane would serialize on a few bins.
template <bool kCount, typename WeightOf>
__device__ __forceinline__ void add_to_bin(WideCounters<kBins>& bins, bool in, int bin, float v, WeightOf weight_of) {
  if (!__any_sync(kFullMask, in)) return;
  const unsigned peers = __match_any_sync(kFullMask, in ? bin : kNoBin);
  const bool leader = in && lane_id() == __ffs(int(peers)) - 1;
  if constexpr (kCount) {
    if (leader) bins.add(bin, (unsigned long long)__popc(peers));
  } else {
    const unsigned long long w = in ? weight_of(v) : 0ull;
    const unsigned low = __reduce_add_sync(peers, unsigned(w & 0xFFFFFu));
    const unsigned high = __reduce_add_sync(peers, unsigned(w >> 20));
    if (leader) bins.add(bin, ((unsigned long long)high << 20) + low);
  }
}

// --- block reductions ------------------------------------------------------------------

__device__ __forceinline__ RowStats combine(RowStats a, RowStats b) {
  const float m = fmaxf(a.max, b.max);
  RowStats r;
  r.max = m;
  r.arg = (b.max > a.max || (b.max == a.max && b.arg < a.arg)) ? b.arg : a.arg;
  // A part with no finite element has sum 0 and may have max -inf: never rescale it.
  r.sum = (a.sum > 0 ? a.sum * expf(a.max - m) : 0.0f) + (b.sum > 0 ? b.sum * expf(b.max - m) : 0.0f);
  return r;
}

__device__ __forceinline__ void accumulate(RowStats& s, int id, float x) {
  if (x > s.max) {
    if (s.sum > 0) s.sum *= expf(s.max - x);
    s.max = x;
    s.arg = id;
  } else if (x == s.max && id < s.arg) {
    s.arg = id;
  }
  if (x != -INFINITY) s.sum += expf(x - s.max);
}

// The row's RowStats, on every thread. Fixed combining order: deterministic.
__device__ RowStats block_stats(RowStats s, RowShared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    RowStats other{__shfl_xor_sync(kFullMask, s.max, o), __shfl_xor_sync(kFullMask, s.arg, o),
                   __shfl_xor_sync(kFullMask, s.sum, o)};
    s = combine(s, other);
  }
  if (lane_id() == 0) sh.warp_stats[threadIdx.x / 32] = s;
  __syncthreads();
  s = sh.warp_stats[lane_id()];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    RowStats other{__shfl_xor_sync(kFullMask, s.max, o), __shfl_xor_sync(kFullMask, s.arg, o),
                   __shfl_xor_sync(kFullMask, s.sum, o)};
    s = combine(s, other);
  }
  __syncthreads();  // warp_stats is reused by the next reduction
  return s;
}

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ unsigned long long warp_inclusive_scan(unsigned long long v) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long up = __shfl_up_sync(kFullMask, v, o);
    if (lane_id() >= o) v += up;
  }
  return v;
}

// Exclusive prefix sum of v over the block's threads in thread order.
__device__ unsigned long long block_exclusive_scan(unsigned long long v, RowShared& sh) {
  const unsigned long long inclusive = warp_inclusive_scan(v);
  if (lane_id() == 31) sh.warp_total[threadIdx.x / 32] = inclusive;
  __syncthreads();
  const unsigned long long warp_prefix = warp_inclusive_scan(sh.warp_total[lane_id()]);
  const unsigned long long before_warp =
      __shfl_sync(kFullMask, warp_prefix, int(threadIdx.x / 32)) - sh.warp_total[threadIdx.x / 32];
  __syncthreads();  // warp_total is reused
  return before_warp + inclusive - v;
}

// --- radix select ---------------------------------------------------------------------

// Which of the 256 entries (8 per lane: lane j holds entries first_entry(j, 0..7)) first
// brings the running weight `before` + ... to at least `target`, walking in the given
// direction. One warp; returns the entry and the weight before it. If none does (impossible
// when the target is within the total), the last entry.
struct Crossing {
  int entry;
  unsigned long long before;
};

template <typename Weights, typename EntryOf>
__device__ Crossing warp_find_crossing(const Weights& weight, EntryOf entry_of,
                                       unsigned long long before, unsigned long long target) {
  unsigned long long local = 0;
#pragma unroll
  for (int t = 0; t < 8; ++t) local += weight[entry_of(lane_id(), t)];
  const unsigned long long inclusive = warp_inclusive_scan(local);
  const unsigned hit = __ballot_sync(kFullMask, before + inclusive >= target);
  const int lane = hit ? __ffs(int(hit)) - 1 : 31;
  unsigned long long running = before + __shfl_sync(kFullMask, inclusive - local, lane);
  int entry = entry_of(lane, 7);
  for (int t = 0; t < 8; ++t) {
    const int e = entry_of(lane, t);
    if (running + weight[e] >= target) {
      entry = e;
      break;
    }
    if (t < 7) running += weight[e];
  }
  return {entry, running};
}

// The largest key kappa such that the weight of participating elements with key >= kappa
// reaches the target. Elements participate when their key is at least min_key; each weighs 1
// (kCount) or weight_of(x) (< 2^41). With top_p >= 0 the target is top_p_need(top_p, total
// weight), known after the first pass; otherwise it is `target`.
template <bool kCount, typename WeightOf>
__device__ Selection radix_select(const float* x, int n, uint32_t min_key, WeightOf weight_of,
                                  unsigned long long target, float top_p, RowShared& sh) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    sh.bins.clear();
    __syncthreads();
    for_each_id(x, n, [&](int, float v, bool valid) {
      const uint32_t key = order_key(v);
      const bool in = valid && key >= min_key && (key & mask) == prefix;
      add_to_bin<kCount>(sh.bins, in, int((key >> shift) & 0xFFu), v, weight_of);
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      if (shift == 24 && top_p >= 0.0f) {
        unsigned long long total = 0;
        for (int t = 0; t < 8; ++t) total += sh.bins[lane_id() * 8 + t];
        target = rule::top_p_need(top_p, warp_sum(total));
      }
      // Digits from the largest down: lane j holds 255 - 8j .. 248 - 8j.
      const Crossing c = warp_find_crossing(sh.bins, [](int lane, int t) { return kBins - 1 - 8 * lane - t; },
                                            above, target);
      if (lane_id() == 0) {
        sh.selection = {prefix | (uint32_t(c.entry) << shift), c.before, sh.bins[c.entry]};
        sh.select_target = target;
      }
    }
    __syncthreads();
    prefix = sh.selection.key;
    above = sh.selection.above;
    target = sh.select_target;
    mask |= 0xFFu << shift;
  }
  return sh.selection;  // every thread read it after the last barrier
}

// --- the draw ------------------------------------------------------------------------

// Step 3d over N = { key(z) >= min_key }: the first id whose running mass (id order) exceeds
// floor(u * mass(N)), else the last id of N.
__device__ int draw_token(const float* z, int n, uint32_t min_key, float max_z, float inv_temperature, double u,
                          RowShared& sh) {
  sh.tile_mass.clear();
  if (threadIdx.x == 0) sh.last_kept_id = -1;
  __syncthreads();
  auto weight = [&](float v, bool valid) {
    return valid && order_key(v) >= min_key ? rule::token_mass(v, max_z, inv_temperature) : 0ull;
  };
  int last = -1;
  for (int base = 0; base < n; base += kTile) {
    float v[kPerThread];
#pragma unroll
    for (int slot = 0; slot < kPerThread; ++slot) {
      const int i = base + slot * kThreads + int(threadIdx.x);
      v[slot] = i < n ? z[i] : 0.0f;
    }
    unsigned long long sum = 0;
#pragma unroll
    for (int slot = 0; slot < kPerThread; ++slot) {
      const int i = base + slot * kThreads + int(threadIdx.x);
      const bool kept = i < n && order_key(v[slot]) >= min_key;
      if (kept) last = i;
      if (__any_sync(kFullMask, kept)) sum += weight(v[slot], kept);  // weights only where a warp needs one
    }
    sum = warp_sum(sum);
    if (lane_id() == 0 && sum) sh.tile_mass.add(base / kTile, sum);
  }
  last = __reduce_max_sync(kFullMask, last);
  if (lane_id() == 0) atomicMax(&sh.last_kept_id, last);
  __syncthreads();
  if (threadIdx.x < 32) {
    unsigned long long local = 0;
    for (int t = 0; t < 8; ++t) local += sh.tile_mass[lane_id() * 8 + t];
    const unsigned long long kept = warp_sum(local);
    const unsigned long long target = rule::draw_target(u, kept);
    // Tiles in id order: lane j holds 8j .. 8j + 7; those past the row's end weigh 0.
    const Crossing c = warp_find_crossing(sh.tile_mass, [](int lane, int t) { return 8 * lane + t; }, 0ull,
                                          target + 1);
    if (lane_id() == 0) {
      const bool found = target < kept;
      sh.draw_tile = found ? c.entry : -1;
      sh.draw_before = c.before;
      sh.draw_target = target;
      sh.token = sh.last_kept_id;
    }
  }
  __syncthreads();
  if (sh.draw_tile < 0) return sh.token;
  // The tile in id order: thread t holds ids tile_base + 4t .. 4t + 3.
  const int first = sh.draw_tile * kTile + int(threadIdx.x) * kPerThread;
  unsigned long long w[kPerThread], own = 0;
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int i = first + e;
    w[e] = weight(i < n ? z[i] : 0.0f, i < n);
    own += w[e];
  }
  unsigned long long running = sh.draw_before + block_exclusive_scan(own, sh);
  const unsigned long long target = sh.draw_target;
  if (running <= target && target < running + own) {
    for (int e = 0; e < kPerThread; ++e) {
      running += w[e];
      if (running > target) {
        sh.token = first + e;
        break;
      }
    }
  }
  __syncthreads();
  return sh.token;
}

// --- top logprobs ---------------------------------------------------------------------

// The lowest ids among the ties at `key`, `needed` of them, into top slots from `first_slot`:
// the row in order, 1024 ids per step, until enough are taken.
__device__ void take_lowest_ties(const float* l, int n, uint32_t key, int needed, int first_slot, RowShared& sh) {
  if (threadIdx.x == 0) sh.ties_taken = 0;
  __syncthreads();
  for (int base = 0; base < n && sh.ties_taken < needed; base += kThreads) {
    const int i = base + int(threadIdx.x);
    const bool tie = i < n && order_key(l[i]) == key;
    const unsigned long long before = block_exclusive_scan(tie ? 1ull : 0ull, sh);
    const int rank = sh.ties_taken + int(before);
    if (tie && rank < needed) {
      sh.top_key[first_slot + rank] = key;
      sh.top_id[first_slot + rank] = i;
    }
    __syncthreads();  // every thread has read ties_taken
    if (threadIdx.x == kThreads - 1) sh.ties_taken = rank + (tie ? 1 : 0);
    __syncthreads();
  }
}

// Fills out.n_top and the top_* arrays: the n largest raw logits, value descending then id
// ascending, with log-probs x - lse.
__device__ void top_logprobs(const float* l, int n_vocab, int n, float max_logit, float log_sum,
                             RowShared& sh, SampledToken& out) {
  if (n > 0) {
    const Selection s = radix_select<true>(l, n_vocab, 0u, [](float) { return 1ull; }, (unsigned long long)n, -1.0f, sh);
    const int n_above = int(s.above), ties_needed = n - int(s.above);
    const bool all_ties = s.at == (unsigned long long)ties_needed;
    if (threadIdx.x == 0) sh.top_count = 0;
    __syncthreads();
    for_each_id(l, n_vocab, [&](int i, float v, bool valid) {
      const uint32_t key = order_key(v);
      if (valid && (key > s.key || (all_ties && key == s.key))) {
        const int slot = atomicAdd(&sh.top_count, 1);
        if (slot < kMaxTopLogprobs) {
          sh.top_key[slot] = key;
          sh.top_id[slot] = i;
        }
      }
    });
    __syncthreads();
    if (!all_ties) take_lowest_ties(l, n_vocab, s.key, ties_needed, n_above, sh);
    if (threadIdx.x == 0) {  // at most 20 entries: insertion sort by key descending, id ascending
      for (int a = 1; a < n; ++a) {
        const uint32_t k = sh.top_key[a];
        const int id = sh.top_id[a];
        int b = a;
        for (; b > 0 && (sh.top_key[b - 1] < k || (sh.top_key[b - 1] == k && sh.top_id[b - 1] > id)); --b) {
          sh.top_key[b] = sh.top_key[b - 1];
          sh.top_id[b] = sh.top_id[b - 1];
        }
        sh.top_key[b] = k;
        sh.top_id[b] = id;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x < kMaxTopLogprobs) {
    const int j = int(threadIdx.x);
    out.top_ids[j] = j < n ? sh.top_id[j] : 0;
    out.top_logprobs[j] = j < n ? (l[sh.top_id[j]] - max_logit) - log_sum : 0.0f;
  }
}

// --- the kernel ------------------------------------------------------------------------

__device__ RowStats row_stats(const float* x, int n, float* copy, RowShared& sh) {
  RowStats s{-INFINITY, INT_MAX, 0.0f};
  for_each_id(x, n, [&](int i, float v, bool valid) {
    if (!valid) return;
    accumulate(s, i, v);
    if (copy) copy[i] = v;
  });
  return block_stats(s, sh);
}

__device__ void sample_row(const SampleParams& p, int row, RowShared& sh) {
  const SamplingRow r = p.rows[row];
  const int n = p.vocab;
  const float* l = p.logits + size_t(row) * size_t(n);
  int64_t pen_begin = r.penalty_count > 0 ? r.penalty_begin : 0;
  int64_t pen_end = r.penalty_count > 0 ? pen_begin + r.penalty_count : 0;
  pen_begin = pen_begin < 0 ? 0 : (pen_begin > p.n_penalties ? p.n_penalties : pen_begin);
  pen_end = pen_end < pen_begin ? pen_begin : (pen_end > p.n_penalties ? p.n_penalties : pen_end);
  const bool penalized = pen_end > pen_begin &&
                         (r.repetition_penalty != 1.0f || r.presence_penalty != 0 || r.frequency_penalty != 0);
  float* copy = penalized ? p.scratch + size_t(blockIdx.x) * size_t(n) : nullptr;

  const RowStats raw = row_stats(l, n, copy, sh);
  const float* z = l;
  RowStats zs = raw;
  if (penalized) {  // row_stats' barrier made the copy visible to the whole block
    for (int64_t e = pen_begin + threadIdx.x; e < pen_end; e += kThreads) {
      const int id = p.penalty_ids[e];
      if (id >= 0 && id < n)
        copy[id] = rule::penalized(l[id], p.penalty_counts[e], r.repetition_penalty, r.presence_penalty,
                                   r.frequency_penalty);
    }
    __syncthreads();
    z = copy;
    zs = row_stats(z, n, nullptr, sh);
  }
  int token = zs.arg;
  if (r.temperature > 0) {
    uint32_t min_key = 0;  // every key of a float is above 0 but one NaN pattern
    if (r.top_k > 0 && r.top_k < n)
      min_key = radix_select<true>(z, n, 0u, [](float) { return 1ull; }, (unsigned long long)r.top_k, -1.0f, sh).key;
    const float max_z = zs.max, inv_temperature = rule::inverse_temperature(r.temperature);
    auto mass = [=](float v) { return rule::token_mass(v, max_z, inv_temperature); };
    if (r.top_p < 1.0f)
      min_key = radix_select<false>(z, n, min_key, mass, 0ull, fmaxf(r.top_p, 0.0f), sh).key;
    token = draw_token(z, n, min_key, max_z, inv_temperature, uniform_double(r.seed, r.position), sh);
  }
  if (token < 0 || token >= n) token = 0;  // only rows holding NaN get here; keep l[token] in bounds
  SampledToken& out = p.out[row];
  const float log_sum = logf(raw.sum);
  const int n_top = min(max(r.n_top_logprobs, 0), min(kMaxTopLogprobs, n));
  top_logprobs(l, n, n_top, raw.max, log_sum, sh, out);
  if (threadIdx.x == 0) {
    out.token = token;
    out.logprob = (l[token] - raw.max) - log_sum;
    out.n_top = n_top;
    out.pad = 0;
  }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ RowShared sh;
  for (int row = int(blockIdx.x); row < p.n_rows; row += int(gridDim.x)) {
    sample_row(p, row, sh);
    __syncthreads();  // the next row reuses the shared state and the workspace slot
  }
}

int sample_blocks(int64_t n_rows) { return int(std::min<int64_t>(n_rows, kMaxBlocks)); }

}  // namespace

int64_t sample_workspace_bytes(int64_t n_rows, int64_t vocab) {
  TETRA_CHECK(n_rows >= 0 && vocab >= 1 && vocab <= kSampleMaxVocab, "sample: ", n_rows, " rows of ", vocab,
              " logits: the vocabulary must be 1 to ", kSampleMaxVocab);
  return int64_t(sample_blocks(n_rows)) * vocab * int64_t(sizeof(float));
}

void launch_sample(const KernelLaunch& launch, const float* logits, int64_t n_rows, int64_t vocab,
                   const SamplingRow* rows, const int32_t* penalty_ids, const int32_t* penalty_counts,
                   int64_t n_penalties, SampledToken* out, void* workspace) {
  TETRA_CHECK(n_rows >= 0 && n_rows <= INT_MAX && vocab >= 1 && vocab <= kSampleMaxVocab, "sample: ", n_rows,
              " rows of ", vocab, " logits: the vocabulary must be 1 to ", kSampleMaxVocab);
  TETRA_CHECK(n_penalties >= 0 && n_penalties <= INT_MAX, "sample: ", n_penalties, " penalty entries");
  if (n_rows == 0) return;
  TETRA_CHECK(logits && rows && out && workspace, "sample: logits, rows, out and workspace must be given");
  TETRA_CHECK(n_penalties == 0 || (penalty_ids && penalty_counts),
              "sample: penalty entries need both their id and count lists");
  const SampleParams params{logits,        int(n_rows), int(vocab), rows, penalty_ids,
                            penalty_counts, int(n_penalties), out, static_cast<float*>(workspace)};
  launch_kernel(launch, sample_kernel, sample_blocks(n_rows), kThreads, 0, params);
  TETRA_CUDA_CHECK_LAUNCH("sample_kernel");
}

}  // namespace tetra::ops::cuda
