// A batch of logits rows for the sampling tests (CPU and CUDA): one vocabulary, each row's
// SamplingRow, and the penalty lists the rows index into, laid out as Backend::sample takes them;
// step 1 of the rule done the obvious way, and cases worked by hand that both backends must pass.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ops/cpu/sampling.h"
#include "ops/ops.h"

namespace tetra::ops::testing_util {

struct SamplingBatch {
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingRow> rows;
  std::vector<int32_t> penalty_ids, penalty_counts;

  explicit SamplingBatch(int64_t v) : vocab(v) {}
  int64_t n_rows() const { return int64_t(rows.size()); }
  // Appends a row; penalties are (id, count) pairs, count 0 for a token of the prompt alone.
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

  // Row r's z: its logits with the penalties applied at its entries, one entry at a time.
  std::vector<float> penalized_row(int64_t r) const {
    const SamplingRow& s = rows[size_t(r)];
    std::vector<float> z(row(r), row(r) + vocab);
    for (int32_t e = s.penalty_begin; e < s.penalty_begin + s.penalty_count; ++e) {
      const int32_t id = penalty_ids[size_t(e)];
      z[size_t(id)] = sampling::penalized(row(r)[id], penalty_counts[size_t(e)], s.repetition_penalty,
                                          s.presence_penalty, s.frequency_penalty);
    }
    return z;
  }
};

// Greedy rows whose first maximum the repetition penalty moves, worked by hand, with the token
// each must give: vLLM's rule (l / rp where l > 0, l * rp elsewhere) over the prompt's and the
// output's tokens, presence and frequency over the output's alone, repetition first.
struct WorkedRepetition {
  SamplingBatch batch{4};
  std::vector<int32_t> tokens;

  WorkedRepetition() {
    const std::vector<float> l = {2.0f, 1.5f, 0.5f, -0.5f};
    auto row = [](float repetition, float presence = 0, float frequency = 0) {
      SamplingRow r;
      r.repetition_penalty = repetition;
      r.presence_penalty = presence;
      r.frequency_penalty = frequency;
      return r;
    };
    add(l, row(2.0f), {{0, 0}}, 1);               // a prompt token: z0 = 2 / 2 = 1 < 1.5
    add(l, row(2.0f), {{0, 1}}, 1);               // an output token alike
    add(l, row(5.0f), {{0, 0}, {1, 3}}, 2);       // z0 = 0.4, z1 = 0.3: id 2's 0.5 leads
    add(l, row(0.5f), {{1, 0}}, 1);               // rp < 1 favours a token: z1 = 3
    add(l, row(1.0f, 5.0f, 5.0f), {{0, 0}}, 0);   // count 0: presence and frequency skip it
    add(l, row(1.0f, 5.0f), {{0, 1}}, 1);         // count 1: z0 = 2 - 5
    // Repetition first: 2 / 2 - 0.5 = 0.5 < 0.6; the other order, (2 - 0.5) / 2 = 0.75, would win.
    add({2.0f, 0.6f, 0.1f, 0.0f}, row(2.0f, 0.0f, 0.5f), {{0, 1}}, 1);
    // Negative logits multiply: -0.5 * 1.5 = -0.75 < -0.6 (dividing would keep id 1 at -0.33).
    add({-1.0f, -0.5f, -0.6f, -3.0f}, row(1.5f), {{1, 0}}, 2);
    // A penalty that overflows every logit to -inf leaves them at -FLT_MAX: a tie, the first id.
    add({-2.0f, -3.0f, -4.0f, -5.0f}, row(3e38f), {{0, 0}, {1, 0}, {2, 0}, {3, 0}}, 0);
    // A penalty dividing a positive logit past the float's range stays at FLT_MAX.
    add({10.0f, 3.0f, 0.0f, -1.0f}, row(1e-38f), {{0, 0}}, 0);
  }

 private:
  void add(const std::vector<float>& l, SamplingRow r, const std::vector<std::pair<int32_t, int32_t>>& entries,
           int32_t token) {
    batch.add(l, r, entries);
    tokens.push_back(token);
  }
};

}  // namespace tetra::ops::testing_util
