// Multi-head latent attention (absorbed form) and the DSA indexer on the CPU.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cpu/cpu_backend.h"

namespace tetra::ops::cpu {
void mla_attention(ThreadPool* pool, TensorView q_latent, TensorView q_rope, const KvCacheLayer& cache,
                   const AttentionBatch& batch, float scale, TensorView selected, TensorView out) {
  const int64_t n_tokens = q_latent.dim(0), n_heads = q_latent.dim(1), rank = q_latent.dim(2);
  const int64_t d_rope = q_rope.dim(2), width = cache.k.dim(-1);
  TETRA_CHECK(width == rank + d_rope, "mla_attention: cache rows of ", width, " are not latent ",
              rank, " + rope ", d_rope);
  const int64_t top_k = selected.empty() ? 0 : selected.dim(1);
  const auto seq_of = sequence_of_tokens(batch);
  pool->parallel_for(n_tokens * n_heads, 2, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<int64_t> keys;
    std::vector<double> acc(static_cast<size_t>(rank));
    std::vector<float> row_buf(static_cast<size_t>(width));  // a decoded FP8 row (scale 1)
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads;
      const int64_t pos = batch.positions.as<const int32_t>()[t];
      keys.clear();
      if (top_k > 0) {
        for (int64_t j = 0; j < top_k; ++j) {
          const int32_t p = selected.as<const int32_t>()[t * top_k + j];
          if (p >= 0 && p <= pos) keys.push_back(p);
        }
      } else {
        for (int64_t p = 0; p <= pos; ++p) keys.push_back(p);
      }
      const float* ql = q_latent.as<const float>() + (t * n_heads + h) * rank;
      const float* qr = q_rope.as<const float>() + (t * n_heads + h) * d_rope;
      scores.resize(keys.size());
      float max_score = -INFINITY;
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* row = cache_row(cache.k, cache_slot(batch, seq_of[size_t(t)], keys[j]), width, 1.0f, row_buf.data());
        float s = 0;
        for (int64_t d = 0; d < rank; ++d) s += ql[d] * row[d];
        for (int64_t d = 0; d < d_rope; ++d) s += qr[d] * row[rank + d];
        scores[j] = s * scale;
        max_score = std::max(max_score, scores[j]);
      }
      double denom = 0;
      for (auto& s : scores) denom += (s = std::exp(s - max_score));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* row = cache_row(cache.k, cache_slot(batch, seq_of[size_t(t)], keys[j]), width, 1.0f, row_buf.data());
        const double p = scores[j] / denom;
        for (int64_t d = 0; d < rank; ++d) acc[size_t(d)] += p * row[d];
      }
      float* o = out.as<float>() + (t * n_heads + h) * rank;
      for (int64_t d = 0; d < rank; ++d) o[d] = float(acc[size_t(d)]);
    }
  });
}

void dsa_select(TensorView q, TensorView weights, const KvCacheLayer& cache, const AttentionBatch& batch,
                float q_scale, float weight_scale, TensorView selected) {
  const int64_t n_tokens = q.dim(0), n_heads = q.dim(1), dim = q.dim(2);
  const int64_t top_k = selected.dim(1);
  TETRA_CHECK(cache.index_k.dim(-1) == dim, "dsa_select: index keys of ", cache.index_k.dim(-1),
              " values, queries of ", dim);
  const auto seq_of = sequence_of_tokens(batch);
  std::vector<float> score;
  std::vector<int32_t> order;
  std::vector<float> row_buf(static_cast<size_t>(dim));  // a decoded FP8 key (scale 1)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t n_keys = int64_t(batch.positions.as<const int32_t>()[t]) + 1;
    score.assign(static_cast<size_t>(n_keys), 0.0f);
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* k = cache_row(cache.index_k, cache_slot(batch, seq_of[size_t(t)], j), dim, 1.0f, row_buf.data());
      float s = 0;
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* qh = q.as<const float>() + (t * n_heads + h) * dim;
        float dot = 0;
        for (int64_t d = 0; d < dim; ++d) dot += qh[d] * k[d];
        s += std::max(0.0f, dot * q_scale) * (weights.as<const float>()[t * n_heads + h] * weight_scale);
      }
      score[size_t(j)] = s;
    }
    order.resize(static_cast<size_t>(n_keys));
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = std::min(top_k, n_keys);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
    });
    for (int64_t j = 0; j < top_k; ++j)
      selected.as<int32_t>()[t * top_k + j] = j < k ? order[size_t(j)] : -1;
  }
}

void head_linear(ThreadPool* pool, TensorView x, const LinearWeight& w, int64_t head_stride,
                 int64_t row0, int64_t n_rows, bool transposed, TensorView out) {
  const int64_t n_tokens = x.dim(0), n_heads = x.dim(1), k = w.n_in;
  TETRA_CHECK(n_heads * head_stride <= w.n_out && row0 + n_rows <= head_stride,
              "head_linear: ", n_heads, " heads of ", head_stride, " rows do not fit a weight of ",
              w.n_out, " rows");
  const int64_t x_width = transposed ? n_rows : k, out_width = transposed ? k : n_rows;
  TETRA_CHECK(x.dim(2) == x_width && out.dim(2) == out_width, "head_linear: widths ", x.dim(2),
              " -> ", out.dim(2), " do not match the weight block");
  pool->parallel_for(n_heads, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> block(static_cast<size_t>(n_rows * k));
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t r = 0; r < n_rows; ++r) decode_weight_row(w, h * head_stride + row0 + r, block.data() + r * k);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xv = x.as<const float>() + (t * n_heads + h) * x_width;
        float* o = out.as<float>() + (t * n_heads + h) * out_width;
        if (transposed) {
          std::fill(o, o + k, 0.0f);
          for (int64_t r = 0; r < n_rows; ++r)
            for (int64_t c = 0; c < k; ++c) o[c] += block[size_t(r * k + c)] * xv[r];
        } else {
          for (int64_t r = 0; r < n_rows; ++r) {
            float s = 0;
            for (int64_t c = 0; c < k; ++c) s += block[size_t(r * k + c)] * xv[c];
            o[r] = s;
          }
        }
      }
    }
  });
}

}  // namespace tetra::ops::cpu
