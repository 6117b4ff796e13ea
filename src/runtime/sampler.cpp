#include "runtime/sampler.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace tetra::runtime {

void count_token(TokenCounts& counts, int32_t token) {
  auto it = std::lower_bound(counts.begin(), counts.end(), std::pair<int32_t, int32_t>(token, 0));
  if (it != counts.end() && it->first == token)
    ++it->second;
  else
    counts.insert(it, {token, 1});
}

std::vector<int32_t> distinct_tokens(std::span<const int32_t> tokens) {
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

namespace {

bool output_penalized(const SamplingParams& p) { return p.presence_penalty != 0 || p.frequency_penalty != 0; }
bool prompt_penalized(const SamplingParams& p) { return p.repetition_penalty != 1.0f; }

// Writes a row's penalty entries at ids/counts: the generated tokens with their counts, merged
// in id order with the prompt's tokens (count 0 where not generated) when the repetition
// penalty reads them. Returns the entries written.
int64_t write_penalties(const SampleRequest& r, int32_t* ids, int32_t* counts) {
  if (!output_penalized(r.params) && !prompt_penalized(r.params)) return 0;
  const std::span<const int32_t> prompt = prompt_penalized(r.params) ? r.prompt_tokens : std::span<const int32_t>{};
  const std::span<const std::pair<int32_t, int32_t>> generated = r.generated_counts;
  int64_t at = 0;
  size_t p = 0, g = 0;
  while (p < prompt.size() || g < generated.size()) {
    if (g == generated.size() || (p < prompt.size() && prompt[p] < generated[g].first)) {
      ids[at] = prompt[p++];
      counts[at] = 0;
    } else {
      if (p < prompt.size() && prompt[p] == generated[g].first) ++p;
      ids[at] = generated[g].first;
      counts[at] = generated[g].second;
      ++g;
    }
    ++at;
  }
  return at;
}

}  // namespace

BatchSampler::BatchSampler(ops::Backend& backend, int64_t max_rows)
    : backend_(backend), max_rows_(max_rows) {
  TETRA_CHECK(max_rows >= 1, "a sampler needs room for one row");
  const int64_t row_bytes = max_rows * int64_t(sizeof(ops::SamplingRow));
  const int64_t out_bytes = max_rows * int64_t(sizeof(ops::SampledToken));
  rows_host_ = backend.alloc_host(row_bytes);
  rows_dev_ = backend.alloc(DType::U8, {row_bytes});
  out_host_ = backend.alloc_host(out_bytes);
  out_dev_ = backend.alloc(DType::U8, {out_bytes});
  reserve_penalties(1024);
}

void BatchSampler::reserve_penalties(int64_t n) {
  if (n <= penalty_capacity_) return;
  penalty_capacity_ = std::max(n, 2 * penalty_capacity_);
  penalty_host_ = backend_.alloc_host(2 * penalty_capacity_ * 4);
  penalty_dev_ = backend_.alloc(DType::I32, {2, penalty_capacity_});
}

std::span<const ops::SampledToken> BatchSampler::sample(const ops::Context& ctx, TensorView logits,
                                                        std::span<const SampleRequest> rows) {
  const int64_t n = int64_t(rows.size());
  TETRA_CHECK(n <= max_rows_, "sample: ", n, " rows, the sampler holds ", max_rows_);
  TETRA_CHECK(logits.shape.rank == 2 && logits.dim(0) == n, "sample: logits are ", logits.shape.str(),
              " for ", n, " rows");
  if (n == 0) return {};
  int64_t n_penalties = 0;  // at most; prompt and generated tokens may coincide
  for (const auto& r : rows) {
    if (output_penalized(r.params) || prompt_penalized(r.params)) n_penalties += int64_t(r.generated_counts.size());
    if (prompt_penalized(r.params)) n_penalties += int64_t(r.prompt_tokens.size());
  }
  reserve_penalties(n_penalties);

  auto* recs = rows_host_->view().as<ops::SamplingRow>();
  int32_t* ids = penalty_host_->view().as<int32_t>();
  int32_t* counts = ids + penalty_capacity_;
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const SampleRequest& r = rows[size_t(i)];
    ops::SamplingRow& rec = recs[i];
    rec = {};
    rec.temperature = r.params.temperature;
    rec.top_p = r.params.top_p;
    rec.top_k = r.params.top_k;
    rec.presence_penalty = r.params.presence_penalty;
    rec.frequency_penalty = r.params.frequency_penalty;
    rec.repetition_penalty = r.params.repetition_penalty;
    rec.n_top_logprobs = r.top_logprobs;
    rec.seed = r.seed;
    rec.position = r.position;
    rec.penalty_begin = int32_t(at);
    rec.penalty_count = int32_t(write_penalties(r, ids + at, counts + at));
    at += rec.penalty_count;
  }
  const TensorView rows_dev = rows_dev_->view().rows(0, n * int64_t(sizeof(ops::SamplingRow)));
  const TensorView out_dev = out_dev_->view().rows(0, n * int64_t(sizeof(ops::SampledToken)));
  const TensorView pen = penalty_dev_->view();
  const TensorView pen_ids{pen.data, DType::I32, {at}, pen.device};
  const TensorView pen_counts{pen.as<int32_t>() + penalty_capacity_, DType::I32, {at}, pen.device};
  backend_.copy_from_host_async(ctx, rows_dev, recs);
  if (at > 0) {
    backend_.copy_from_host_async(ctx, pen_ids, ids);
    backend_.copy_from_host_async(ctx, pen_counts, counts);
  }
  backend_.sample(ctx, logits, rows_dev, pen_ids, pen_counts, out_dev);
  auto* out = out_host_->view().as<ops::SampledToken>();
  const auto wait_start = std::chrono::steady_clock::now();
  backend_.copy_to_host(out, out_dev);  // waits for the stream
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  return {out, size_t(n)};
}

}  // namespace tetra::runtime
