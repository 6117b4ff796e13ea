#include "ops/cuda/qk_rope_kv.h"

#include <cuda_bf16.h>

#include <cmath>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kWarps = 8;

struct HeadArgs {
  void *q, *k;
  const void* v;
  DType dt, vdt, wdt, cdt;
  const void *q_norm, *k_norm;
  float eps;
  const int32_t* positions;
  const float* inv_freq;
  float scaling;
  int half;
  bool interleaved;
  const int32_t* slots;
  void *k_cache, *v_cache;
  int64_t n_tokens, n_slots;
  int n_heads, n_kv_heads, d, d_v;
  float k_scale, v_scale;  // an FP8 cache's (ops::KvCacheLayer)
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per (token, head) over the q heads and then the k heads; a k head's warp also
// moves that head's v. The global writes of each phase are read back by the same warp after
// __syncwarp, so every value is rounded to the activation dtype exactly where the separate
// ops round it.
__global__ void __launch_bounds__(kWarps * 32) qk_rope_kv_kernel(const HeadArgs a) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t w = int64_t(blockIdx.x) * kWarps + int(threadIdx.x) / 32;
  const int heads = a.n_heads + a.n_kv_heads;
  const bool active = w < a.n_tokens * heads;
  const int hh = int(w % heads);
  const bool is_q = hh < a.n_heads;
  const void* norm = is_q ? a.q_norm : a.k_norm;
  // The norm weight and rope's frequencies are fixed at load: read before pdl_wait, so their
  // cold misses overlap the kernel before (launch.cuh). Heads up to kEarly * 32 wide.
  constexpr int kEarly = 8;
  float norm_w[kEarly], freq[kEarly];
#pragma unroll
  for (int j = 0; j < kEarly; ++j) {
    const int i = lane + 32 * j;
    norm_w[j] = active && norm && i < a.d ? load_float(norm, i, a.wdt) : 0.0f;
    freq[j] = active && i < a.half ? a.inv_freq[i] : 0.0f;
  }
  pdl_wait();
  pdl_launch_dependents();
  if (!active) return;
  const int64_t t = w / heads;
  const int kv_head = hh - a.n_heads;
  void* x = is_q ? a.q : a.k;
  const int64_t base = (is_q ? t * a.n_heads + hh : t * a.n_kv_heads + kv_head) * a.d;
  if (norm) {
    float sq = 0.0f;
    for (int i = lane; i < a.d; i += 32) {
      const float v = load_float(x, base + i, a.dt);
      sq += v * v;
    }
    const float inv = rsqrtf(warp_sum(sq) / float(a.d) + a.eps);
#pragma unroll
    for (int j = 0; j < kEarly; ++j) {
      const int i = lane + 32 * j;
      if (i < a.d) store_float(x, base + i, a.dt, norm_w[j] * (load_float(x, base + i, a.dt) * inv));
    }
    for (int i = lane + 32 * kEarly; i < a.d; i += 32) {
      const float v = load_float(x, base + i, a.dt);
      store_float(x, base + i, a.dt, load_float(norm, i, a.wdt) * (v * inv));
    }
    __syncwarp();
  }
  const float pos = float(a.positions[t]);
  for (int p = lane; p < a.half; p += 32) {
    float f = 0.0f;  // freq[p / 32], picked without indexing registers at run time
#pragma unroll
    for (int j = 0; j < kEarly; ++j) f = p / 32 == j ? freq[j] : f;
    const float angle = pos * (p < 32 * kEarly ? f : a.inv_freq[p]);
    const float c = cosf(angle) * a.scaling, s = sinf(angle) * a.scaling;
    const int64_t ia = base + (a.interleaved ? 2 * p : p), ib = base + (a.interleaved ? 2 * p + 1 : p + a.half);
    const float x1 = load_float(x, ia, a.dt), x2 = load_float(x, ib, a.dt);
    store_float(x, ia, a.dt, rotate_first(x1, x2, c, s));
    store_float(x, ib, a.dt, rotate_second(x1, x2, c, s));
  }
  if (is_q) return;
  const int32_t slot = a.slots[t];
  if (slot < 0 || slot >= a.n_slots) return;
  __syncwarp();
  const int64_t k_at = (int64_t(slot) * a.n_kv_heads + kv_head) * a.d;
  for (int i = lane; i < a.d; i += 32)
    store_float(a.k_cache, k_at + i, a.cdt, to_cache_value(load_float(x, base + i, a.dt), a.cdt, a.k_scale));
  const int64_t v_from = (t * a.n_kv_heads + kv_head) * a.d_v, v_at = (int64_t(slot) * a.n_kv_heads + kv_head) * a.d_v;
  for (int i = lane; i < a.d_v; i += 32)
    store_float(a.v_cache, v_at + i, a.cdt, to_cache_value(load_float(a.v, v_from + i, a.vdt), a.cdt, a.v_scale));
}

// The same step for prompt-sized batches, heads held in registers: a warp takes kRowHeads
// heads of a token (q heads, then k heads, in order), lane l keeping values l + 32 j (j < kPer)
// of each, the elements the kernel above visits in the same order, so the norm's sum and every
// rounding are the same. A head is read once and written once instead of a round trip through
// memory per phase; a warp's heads are all loaded before any is computed (a head alone is 256
// bytes in flight, too few to cover the memory's latency), and the token's rotation factors
// are computed once for them. Rope pairs sit in one lane (i and i + half, half a multiple of
// 32) or in lanes l and l ^ 1 (interleaved). Used from kRowsFromTokens tokens: at decode sizes
// it was slower (more registers, no gain in a round trip that PDL hides).
constexpr int64_t kRowsFromTokens = 128;
constexpr int kRowHeads = 4;

template <int kPer>
__global__ void __launch_bounds__(kWarps * 32) qk_rope_kv_rows_kernel(const HeadArgs a) {
  const int lane = int(threadIdx.x) % 32;
  const int heads = a.n_heads + a.n_kv_heads, groups = (heads + kRowHeads - 1) / kRowHeads;
  const int64_t w = int64_t(blockIdx.x) * kWarps + int(threadIdx.x) / 32;
  const bool active = w < a.n_tokens * groups;
  float q_w[kPer], k_w[kPer], freq[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    q_w[j] = active && a.q_norm ? load_float(a.q_norm, i, a.wdt) : 0.0f;
    k_w[j] = active && a.k_norm ? load_float(a.k_norm, i, a.wdt) : 0.0f;
    const int p = a.interleaved ? i / 2 : i;  // the pair this element belongs to
    freq[j] = active && p < a.half ? a.inv_freq[p] : 0.0f;
  }
  pdl_wait();
  pdl_launch_dependents();
  if (!active) return;
  const int64_t t = w / groups;
  const int h0 = int(w % groups) * kRowHeads;
  const auto head_row = [&](int hh) {  // the head's values in q or k
    return hh < a.n_heads ? static_cast<__nv_bfloat16*>(a.q) + (t * a.n_heads + hh) * a.d
                          : static_cast<__nv_bfloat16*>(a.k) + (t * a.n_kv_heads + hh - a.n_heads) * a.d;
  };
  float v[kRowHeads][kPer];
#pragma unroll
  for (int h = 0; h < kRowHeads; ++h) {
    if (h0 + h >= heads) break;
    const __nv_bfloat16* x = head_row(h0 + h);
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[h][j] = __bfloat162float(x[lane + 32 * j]);
  }
  // Value j's rotation factors (for the first of its pair: j < half / 32 unless interleaved).
  const float pos = float(a.positions[t]);
  const int hj = a.half / 32;  // not interleaved: the partner of value j is value j + hj
  float c[kPer], s[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const bool rotated = a.interleaved ? (lane + 32 * j) / 2 < a.half : j < hj;
    const float angle = pos * freq[j];
    c[j] = rotated ? cosf(angle) * a.scaling : 0.0f;
    s[j] = rotated ? sinf(angle) * a.scaling : 0.0f;
  }
  const int32_t slot = a.slots[t];
#pragma unroll
  for (int h = 0; h < kRowHeads; ++h) {
    const int hh = h0 + h;
    if (hh >= heads) break;
    const bool is_q = hh < a.n_heads;
    if (a.q_norm) {
      float sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j) sq += v[h][j] * v[h][j];
      const float inv = rsqrtf(warp_sum(sq) / float(a.d) + a.eps);
#pragma unroll
      for (int j = 0; j < kPer; ++j) v[h][j] = round_to(DType::BF16, (is_q ? q_w[j] : k_w[j]) * (v[h][j] * inv));
    }
    float out[kPer];
    if (a.interleaved) {
      const bool first = (lane & 1) == 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, v[h][j], 1);
        out[j] = v[h][j];
        if ((lane + 32 * j) / 2 < a.half) {
          const float x1 = first ? v[h][j] : other, x2 = first ? other : v[h][j];
          out[j] = first ? rotate_first(x1, x2, c[j], s[j]) : rotate_second(x1, x2, c[j], s[j]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) out[j] = v[h][j];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (j >= hj) break;
#pragma unroll
        for (int k = 0; k < kPer; ++k)  // the partner, picked without indexing registers at run time
          if (k == j + hj) {
            out[j] = rotate_first(v[h][j], v[h][k], c[j], s[j]);
            out[k] = rotate_second(v[h][j], v[h][k], c[j], s[j]);
          }
      }
    }
    __nv_bfloat16* x = head_row(hh);
#pragma unroll
    for (int j = 0; j < kPer; ++j) x[lane + 32 * j] = __float2bfloat16(out[j]);
    if (is_q || slot < 0 || slot >= a.n_slots) continue;
    const int kv_head = hh - a.n_heads;
    const int64_t k_at = (int64_t(slot) * a.n_kv_heads + kv_head) * a.d;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      store_float(a.k_cache, k_at + lane + 32 * j, a.cdt,
                  to_cache_value(round_to(DType::BF16, out[j]), a.cdt, a.k_scale));
    const int64_t v_from = (t * a.n_kv_heads + kv_head) * a.d_v, v_at = (int64_t(slot) * a.n_kv_heads + kv_head) * a.d_v;
    for (int i = lane; i < a.d_v; i += 32)
      store_float(a.v_cache, v_at + i, a.cdt, to_cache_value(load_float(a.v, v_from + i, a.vdt), a.cdt, a.v_scale));
  }
}

// Whether the register-held kernel takes this step, and its values a lane.
int rows_kernel_values(const HeadArgs& a) {
  if (a.n_tokens < kRowsFromTokens || a.dt != DType::BF16 || a.d % 32 != 0 || a.d / 32 > 8) return 0;
  if (a.q_norm && a.wdt != DType::BF16 && a.wdt != DType::F32) return 0;
  if (!a.interleaved && a.half % 32 != 0) return 0;
  return a.d / 32;
}

struct MlaArgs {
  const void* q;
  void *q_nope, *q_rope, *ckv;
  DType dt, wdt, cdt;
  const void* kv_norm;
  float eps;
  const int32_t* positions;
  const float* inv_freq;
  float scaling;
  int half;
  bool interleaved;
  const int32_t* slots;
  void* cache;
  int64_t n_tokens, n_slots;
  int n_heads, dn, dr, rank;
  bool vector_copy;  // q_nope copied 16 bytes at a time (2-byte values, 16-byte aligned rows)
};

// Rotates the dr values at src[from ..] into dst[to ..] (pairs as rope.cu forms them; values
// past the rotary dims are copied). src and dst may be the same row.
__device__ __forceinline__ void rope_row(const MlaArgs& a, const void* src, int64_t from, void* dst, int64_t to,
                                         float pos, int lane) {
  for (int p = lane; p < a.half; p += 32) {
    const float angle = pos * a.inv_freq[p];
    const float c = cosf(angle) * a.scaling, s = sinf(angle) * a.scaling;
    const int ia = a.interleaved ? 2 * p : p, ib = a.interleaved ? 2 * p + 1 : p + a.half;
    const float x1 = load_float(src, from + ia, a.dt), x2 = load_float(src, from + ib, a.dt);
    store_float(dst, to + ia, a.dt, rotate_first(x1, x2, c, s));
    store_float(dst, to + ib, a.dt, rotate_second(x1, x2, c, s));
  }
  for (int i = 2 * a.half + lane; i < a.dr; i += 32) store_float(dst, to + i, a.dt, load_float(src, from + i, a.dt));
}

// Warp w of a token's H + 1: a query head (split and rotated), or the cache entry (the
// latent's RMSNorm, the rope key's rotation, in place; then the row to its slot, read back
// after __syncwarp so the cache holds the rounded values).
__global__ void __launch_bounds__(kWarps * 32) mla_rope_cache_kernel(const MlaArgs a) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t w = int64_t(blockIdx.x) * kWarps + int(threadIdx.x) / 32;
  const int per_token = a.n_heads + 1;
  const bool active = w < a.n_tokens * per_token;
  const int hh = int(w % per_token);
  const bool is_entry = hh == a.n_heads;
  // The norm weight is fixed at load: read before pdl_wait (launch.cuh), latents up to
  // kEarly * 32 wide; wider ones read the rest after.
  constexpr int kEarly = 16;
  float norm_w[kEarly];
#pragma unroll
  for (int j = 0; j < kEarly; ++j) {
    const int i = lane + 32 * j;
    norm_w[j] = active && is_entry && i < a.rank ? load_float(a.kv_norm, i, a.wdt) : 0.0f;
  }
  pdl_wait();
  pdl_launch_dependents();
  if (!active) return;
  const int64_t t = w / per_token;
  const float pos = float(a.positions[t]);
  if (!is_entry) {
    const int64_t row = t * a.n_heads + hh, src = row * (a.dn + a.dr);
    if (a.vector_copy) {
      // 16 bytes a lane: a copy, so the same bits as the loop below in an eighth of the loads.
      const uint4* from = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.q) + src);
      uint4* to = reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.q_nope) + row * a.dn);
      for (int i = lane; i < a.dn / 8; i += 32) to[i] = from[i];
    } else {
      for (int i = lane; i < a.dn; i += 32) store_float(a.q_nope, row * a.dn + i, a.dt, load_float(a.q, src + i, a.dt));
    }
    rope_row(a, a.q, src + a.dn, a.q_rope, row * a.dr, pos, lane);
    return;
  }
  const int width = a.rank + a.dr;
  const int64_t base = t * width;
  float sq = 0.0f;
  for (int i = lane; i < a.rank; i += 32) {
    const float v = load_float(a.ckv, base + i, a.dt);
    sq += v * v;
  }
  const float inv = rsqrtf(warp_sum(sq) / float(a.rank) + a.eps);
#pragma unroll
  for (int j = 0; j < kEarly; ++j) {
    const int i = lane + 32 * j;
    if (i < a.rank) store_float(a.ckv, base + i, a.dt, norm_w[j] * (load_float(a.ckv, base + i, a.dt) * inv));
  }
  for (int i = lane + 32 * kEarly; i < a.rank; i += 32)
    store_float(a.ckv, base + i, a.dt, load_float(a.kv_norm, i, a.wdt) * (load_float(a.ckv, base + i, a.dt) * inv));
  // Each lane rotates pairs it reads and writes itself: no other lane's value is read here.
  rope_row(a, a.ckv, base + a.rank, a.ckv, base + a.rank, pos, lane);
  const int32_t slot = a.slots[t];
  if (slot < 0 || slot >= a.n_slots) return;
  __syncwarp();
  for (int i = lane; i < width; i += 32)
    store_float(a.cache, int64_t(slot) * width + i, a.cdt, load_float(a.ckv, base + i, a.dt));
}

}  // namespace

void mla_rope_cache_write(const KernelLaunch& launch, TensorView q, TensorView q_nope, TensorView q_rope,
                          TensorView ckv, TensorView kv_norm, float eps, TensorView positions, const RopeSpec& rope,
                          TensorView slots, TensorView cache) {
  const char* op = "mla_rope_cache_write";
  TETRA_CHECK(q.shape.rank == 3 && q_nope.shape.rank == 3 && q_rope.shape.rank == 3 && ckv.shape.rank == 2, op,
              ": q, q_nope and q_rope must be [T, heads, d] and ckv [T, width]");
  const int64_t T = q.dim(0), H = q.dim(1), dn = q_nope.dim(2), dr = q_rope.dim(2), rank = kv_norm.numel();
  TETRA_CHECK(q.dim(2) == dn + dr && q_nope.dim(0) == T && q_rope.dim(0) == T && q_nope.dim(1) == H &&
                  q_rope.dim(1) == H && ckv.dim(0) == T && ckv.dim(1) == rank + dr,
              op, ": q ", q.shape.str(), ", q_nope ", q_nope.shape.str(), ", q_rope ", q_rope.shape.str(), " and ckv ",
              ckv.shape.str(), " do not agree with a latent of ", rank);
  TETRA_CHECK(q_nope.dtype == q.dtype && q_rope.dtype == q.dtype && ckv.dtype == q.dtype, op,
              ": q, q_nope, q_rope and ckv share a dtype");
  TETRA_CHECK(positions.numel() == T && positions.dtype == DType::I32 && slots.numel() == T &&
                  slots.dtype == DType::I32,
              op, ": one I32 position and slot per token");
  TETRA_CHECK(rope.rotary_dim <= dr && rope.rotary_dim % 2 == 0 && rope.inv_freq.dtype == DType::F32 &&
                  rope.inv_freq.numel() * 2 >= rope.rotary_dim,
              op, ": rotary_dim ", rope.rotary_dim, " does not fit a rope part of ", dr);
  TETRA_CHECK(cache.shape.rank >= 2 && cache.numel() == cache.dim(0) * cache.dim(1) * (rank + dr), op, ": the cache ",
              cache.shape.str(), " does not hold rows of ", rank + dr);
  TETRA_CHECK(rank + dr <= INT32_MAX && H < INT32_MAX, op, ": rows too wide");
  if (T == 0) return;
  MlaArgs a{q.data, q_nope.data, q_rope.data, ckv.data, q.dtype, kv_norm.dtype, cache.dtype, kv_norm.data, eps,
            positions.as<const int32_t>(), rope.inv_freq.as<const float>(), rope.attention_scaling,
            rope.rotary_dim / 2, rope.interleaved, slots.as<const int32_t>(), cache.data, T,
            cache.dim(0) * cache.dim(1), int(H), int(dn), int(dr), int(rank), false};
  // Every row of q (dn + dr values) and of q_nope (dn) starts 16 bytes apart from the last.
  a.vector_copy = dtype_bits(q.dtype) == 16 && dn % 8 == 0 && (dn + dr) % 8 == 0 && aligned16(q.data) &&
                  aligned16(q_nope.data);
  const int64_t warps = T * (H + 1);
  TETRA_CHECK((warps + kWarps - 1) / kWarps <= INT32_MAX, op, ": too many heads for one launch");
  launch_kernel(launch, mla_rope_cache_kernel, unsigned((warps + kWarps - 1) / kWarps), kWarps * 32, 0, a);
  TETRA_CUDA_CHECK_LAUNCH(op);
}

void qk_norm_rope_kv_write(const KernelLaunch& launch, TensorView q, TensorView k, TensorView v, TensorView q_norm,
                           TensorView k_norm, float eps, TensorView positions, const RopeSpec& rope, TensorView slots,
                           TensorView k_cache, TensorView v_cache, float k_scale, float v_scale) {
  const char* op = "qk_norm_rope_kv_write";
  TETRA_CHECK(q.shape.rank == 3 && k.shape.rank == 3 && v.shape.rank == 3, op, ": q, k and v must be [T, heads, d]");
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), KV = k.dim(1), Dv = v.dim(2);
  TETRA_CHECK(k.dim(0) == T && v.dim(0) == T && k.dim(2) == D && v.dim(1) == KV, op, ": q ", q.shape.str(), ", k ",
              k.shape.str(), " and v ", v.shape.str(), " do not agree");
  TETRA_CHECK(k.dtype == q.dtype && (q_norm.empty() == k_norm.empty()) &&
                  (q_norm.empty() || (q_norm.numel() == D && k_norm.numel() == D && q_norm.dtype == k_norm.dtype)),
              op, ": q and k share a dtype, and q_norm and k_norm are both [", D, "] or both absent");
  TETRA_CHECK(positions.numel() == T && positions.dtype == DType::I32 && slots.numel() == T &&
                  slots.dtype == DType::I32,
              op, ": one I32 position and slot per token");
  TETRA_CHECK(rope.rotary_dim <= D && rope.rotary_dim % 2 == 0 && rope.inv_freq.dtype == DType::F32 &&
                  rope.inv_freq.numel() * 2 >= rope.rotary_dim,
              op, ": rotary_dim ", rope.rotary_dim, " does not fit a head of ", D);
  TETRA_CHECK(k_cache.shape.rank == 4 && v_cache.shape.rank == 4 && k_cache.dim(2) == KV && k_cache.dim(3) == D &&
                  v_cache.dim(2) == KV && v_cache.dim(3) == Dv && k_cache.dtype == v_cache.dtype,
              op, ": the cache ", k_cache.shape.str(), " / ", v_cache.shape.str(), " does not hold ", KV,
              " KV heads of ", D, " and ", Dv);
  TETRA_CHECK(D <= INT32_MAX && Dv <= INT32_MAX && H + KV <= INT32_MAX, op, ": heads too wide");
  TETRA_CHECK(std::isfinite(k_scale) && k_scale > 0 && std::isfinite(v_scale) && v_scale > 0, op,
              ": the cache scales must be positive, not ", k_scale, " and ", v_scale);
  if (T == 0) return;
  HeadArgs a{q.data, k.data, v.data, q.dtype, v.dtype, q_norm.dtype, k_cache.dtype,
             q_norm.empty() ? nullptr : q_norm.data, k_norm.empty() ? nullptr : k_norm.data, eps,
             positions.as<const int32_t>(), rope.inv_freq.as<const float>(), rope.attention_scaling,
             rope.rotary_dim / 2, rope.interleaved, slots.as<const int32_t>(), k_cache.data, v_cache.data, T,
             k_cache.dim(0) * k_cache.dim(1), int(H), int(KV), int(D), int(Dv), k_scale, v_scale};
  const int values = rows_kernel_values(a);
  const int64_t warps = T * (values ? (H + KV + kRowHeads - 1) / kRowHeads : H + KV);
  TETRA_CHECK((warps + kWarps - 1) / kWarps <= INT32_MAX, op, ": too many heads for one launch");
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  switch (values) {
    case 1: launch_kernel(launch, qk_rope_kv_rows_kernel<1>, blocks, kWarps * 32, 0, a); break;
    case 2: launch_kernel(launch, qk_rope_kv_rows_kernel<2>, blocks, kWarps * 32, 0, a); break;
    case 4: launch_kernel(launch, qk_rope_kv_rows_kernel<4>, blocks, kWarps * 32, 0, a); break;
    case 8: launch_kernel(launch, qk_rope_kv_rows_kernel<8>, blocks, kWarps * 32, 0, a); break;
    default: launch_kernel(launch, qk_rope_kv_kernel, blocks, kWarps * 32, 0, a); break;
  }
  TETRA_CUDA_CHECK_LAUNCH(op);
}

}  // namespace tetra::ops::cuda
