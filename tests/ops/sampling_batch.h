// A batch of logits rows for the sampling tests (CPU and CUDA): one vocabulary, each row's
// SamplingRow, and the penalty lists the rows index into, laid out as Backend::sample takes them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace tetra::ops::testing_util {

struct SamplingBatch {
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingRow> rows;
  std::vector<int32_t> penalty_ids, penalty_counts;

  explicit SamplingBatch(int64_t v) : vocab(v) {}
  int64_t n_rows() const { return int64_t(rows.size()); }
  // Appends a row; penalties are (id, count) pairs.
  void add(const std::vector<float>& row_logits, SamplingRow r,
           const std::vector<std::pair<int32_t, int32_t>>& penalties = {}) {
    logits.insert(logits.end(), row_logits.begin(), row_logits.end());
    r.penalty_begin = int32_t(penalty_ids.size());
    r.penalty_count = int32_t(penalties.size());
    for (auto [id, count] : penalties) {
      penalty_ids.push_back(id);
      penalty_counts.push_back(count);
    }
    rows.push_back(r);
  }
  const float* row(int64_t r) const { return logits.data() + r * vocab; }
};

}  // namespace tetra::ops::testing_util
