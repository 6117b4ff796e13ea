// Rotary embeddings, the paged KV cache and causal attention on the CPU.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_backend.h"

namespace tetra::ops::cpu {

void rope(ThreadPool* pool, TensorView x, TensorView positions, const RopeSpec& spec) {
  const int64_t n_tokens = x.dim(0), n_heads = x.dim(1), head_dim = x.dim(2);
  const int half = spec.rotary_dim / 2;
  TETRA_CHECK(spec.rotary_dim <= head_dim && spec.rotary_dim % 2 == 0,
              "rope: rotary_dim ", spec.rotary_dim, " does not fit a head of ", head_dim);
  const float* inv_freq = spec.inv_freq.as<const float>();
  pool->parallel_for(n_tokens, 4, [&](int64_t t0, int64_t t1) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    for (int64_t t = t0; t < t1; ++t) {
      const float pos = float(positions.as<const int32_t>()[t]);
      for (int i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];  // fp32 product, as transformers forms it
        cos_v[size_t(i)] = std::cos(angle) * spec.attention_scaling;
        sin_v[size_t(i)] = std::sin(angle) * spec.attention_scaling;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x.as<float>() + (t * n_heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          // GPT-J pairs (2i, 2i+1) or half-split pairs (i, i + half). transformers writes the
          // interleaved form de-interleaved; q and k get the same permutation, so q.k and
          // everything downstream are unchanged by rotating in place.
          float& a = spec.interleaved ? v[2 * i] : v[i];
          float& b = spec.interleaved ? v[2 * i + 1] : v[i + half];
          const float x1 = a, x2 = b;
          a = x1 * cos_v[size_t(i)] - x2 * sin_v[size_t(i)];
          b = x2 * cos_v[size_t(i)] + x1 * sin_v[size_t(i)];
        }
      }
    }
  });
}

std::vector<int32_t> sequence_of_tokens(const AttentionBatch& b) {
  std::vector<int32_t> seq_of(static_cast<size_t>(b.n_tokens));
  const int32_t* starts = b.seq_starts.as<const int32_t>();
  for (int s = 0; s < b.n_seqs; ++s)
    for (int32_t t = starts[s]; t < starts[s + 1]; ++t) seq_of[size_t(t)] = s;
  return seq_of;
}

namespace {
// f32 of every E4M3 byte, so reading a cache row is a table lookup.
const float* e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[size_t(i)] = e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table.data();
}
}  // namespace

const float* cache_row(TensorView cache, int64_t row, int64_t width, float scale, float* buf) {
  if (cache.dtype == DType::F32) return cache.as<const float>() + row * width;
  TETRA_CHECK(cache.dtype == DType::F8_E4M3, "the CPU backend reads a KV cache of F32 or F8_E4M3, not ",
              dtype_name(cache.dtype));
  const float* table = e4m3_table();
  const uint8_t* src = cache.as<const uint8_t>() + row * width;
  for (int64_t d = 0; d < width; ++d) buf[d] = table[src[d]] * scale;
  return buf;
}

void cache_write(TensorView rows, const AttentionBatch& batch, TensorView cache, float scale) {
  const int64_t n_slots = cache.dim(0) * cache.dim(1);
  const int64_t width = rows.numel() / std::max<int64_t>(1, rows.dim(0));
  TETRA_CHECK(width * n_slots == cache.numel(), "cache_write: rows of ", width,
              " values do not fit a cache of shape ", cache.shape.str());
  for (int64_t t = 0; t < batch.n_tokens; ++t) {
    const int32_t slot = batch.slot_mapping.as<const int32_t>()[t];
    if (slot == -1) continue;  // a padding token
    TETRA_CHECK(slot >= 0 && slot < n_slots, "cache_write: slot ", slot, " is outside the cache of ",
                n_slots);
    const float* src = rows.as<const float>() + t * width;
    if (cache.dtype == DType::F32) {
      std::copy_n(src, width, cache.as<float>() + slot * width);
    } else {
      TETRA_CHECK(cache.dtype == DType::F8_E4M3, "cache_write: the CPU backend writes a KV cache of F32 or ",
                  "F8_E4M3, not ", dtype_name(cache.dtype));
      // Divide, not multiply by 1/scale, so the stored byte is e4m3(x / scale) exactly.
      uint8_t* dst = cache.as<uint8_t>() + slot * width;
      for (int64_t d = 0; d < width; ++d) dst[d] = f32_to_e4m3(src[d] / scale);
    }
  }
}

void kv_write(TensorView k, TensorView v, const AttentionBatch& batch, const KvCacheLayer& cache) {
  cache_write(k, batch, cache.k, cache.k_scale);
  cache_write(v, batch, cache.v, cache.v_scale);
}

void attention(ThreadPool* pool, TensorView q, const KvCacheLayer& cache, const AttentionBatch& batch,
               float scale, TensorView out) {
  const int64_t n_tokens = q.dim(0), n_heads = q.dim(1), d_k = q.dim(2);
  const int64_t n_kv_heads = cache.k.dim(2), d_v = cache.v.dim(3);
  TETRA_CHECK(n_heads % n_kv_heads == 0, "attention: ", n_heads, " heads cannot share ", n_kv_heads,
              " KV heads");
  const int64_t group = n_heads / n_kv_heads;
  const auto seq_of = sequence_of_tokens(batch);

  pool->parallel_for(n_tokens * n_heads, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(d_v));
    std::vector<float> row_buf(static_cast<size_t>(std::max(d_k, d_v)));  // a decoded FP8 row
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads, kvh = h / group;
      const int64_t n_keys = int64_t(batch.positions.as<const int32_t>()[t]) + 1;
      const float* qv = q.as<const float>() + (t * n_heads + h) * d_k;
      scores.resize(size_t(n_keys));
      float max_score = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        const int64_t slot = cache_slot(batch, seq_of[size_t(t)], j);
        const float* kv = cache_row(cache.k, slot * n_kv_heads + kvh, d_k, cache.k_scale, row_buf.data());
        float s = 0;
        for (int64_t d = 0; d < d_k; ++d) s += qv[d] * kv[d];
        scores[size_t(j)] = s * scale;
        max_score = std::max(max_score, scores[size_t(j)]);
      }
      float denom = 0;
      for (auto& s : scores) denom += (s = std::exp(s - max_score));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < n_keys; ++j) {
        const int64_t slot = cache_slot(batch, seq_of[size_t(t)], j);
        const float* vv = cache_row(cache.v, slot * n_kv_heads + kvh, d_v, cache.v_scale, row_buf.data());
        const float p = scores[size_t(j)] / denom;
        for (int64_t d = 0; d < d_v; ++d) acc[size_t(d)] += p * vv[d];
      }
      std::copy(acc.begin(), acc.end(), out.as<float>() + (t * n_heads + h) * d_v);
    }
  });
}

}  // namespace tetra::ops::cpu
