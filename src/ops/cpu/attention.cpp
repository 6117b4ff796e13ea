// Rotary embeddings, the paged KV cache and causal attention on the CPU.
#include <algorithm>
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

void cache_write(TensorView rows, const AttentionBatch& batch, TensorView cache) {
  const int64_t n_slots = cache.dim(0) * cache.dim(1);
  const int64_t width = rows.numel() / std::max<int64_t>(1, rows.dim(0));
  TETRA_CHECK(width * n_slots == cache.numel(), "cache_write: rows of ", width,
              " values do not fit a cache of shape ", cache.shape.str());
  for (int64_t t = 0; t < batch.n_tokens; ++t) {
    const int32_t slot = batch.slot_mapping.as<const int32_t>()[t];
    if (slot == -1) continue;  // a padding token
    TETRA_CHECK(slot >= 0 && slot < n_slots, "cache_write: slot ", slot, " is outside the cache of ",
                n_slots);
    std::copy_n(rows.as<const float>() + t * width, width, cache.as<float>() + slot * width);
  }
}

void kv_write(TensorView k, TensorView v, const AttentionBatch& batch, const KvCacheLayer& cache) {
  cache_write(k, batch, cache.k);
  cache_write(v, batch, cache.v);
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
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads, kvh = h / group;
      const int64_t n_keys = int64_t(batch.positions.as<const int32_t>()[t]) + 1;
      const float* qv = q.as<const float>() + (t * n_heads + h) * d_k;
      scores.resize(size_t(n_keys));
      float max_score = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        const int64_t slot = cache_slot(batch, seq_of[size_t(t)], j);
        const float* kv = cache.k.as<const float>() + (slot * n_kv_heads + kvh) * d_k;
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
        const float* vv = cache.v.as<const float>() + (slot * n_kv_heads + kvh) * d_v;
        const float p = scores[size_t(j)] / denom;
        for (int64_t d = 0; d < d_v; ++d) acc[size_t(d)] += p * vv[d];
      }
      std::copy(acc.begin(), acc.end(), out.as<float>() + (t * n_heads + h) * d_v);
    }
  });
}

}  // namespace tetra::ops::cpu
