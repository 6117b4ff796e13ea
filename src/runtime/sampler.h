// Next-token choice for a batch of rows of logits, on the backend that holds them
// (Backend::sample: greedy at temperature 0, otherwise temperature, top-k and top-p with
// repetition, presence and frequency penalties, from a counter-based generator, so a seed gives
// the same text in any batch and after any preemption). Only the chosen tokens and the
// log-probs asked for come back to the host.
//
// Penalty lists are uploaded every step, 8 bytes per entry: a row's generated tokens when it
// has a presence or frequency penalty, and with a repetition penalty also its prompt's distinct
// tokens (a 4,096-token prompt of some 1,500 distinct ids adds 12 KB a step to that row; rows
// without a repetition penalty upload none of their prompt).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace tetra::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 = all tokens
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // > 0; 1 = off; reads the prompt's tokens and the output's
};

// A sequence's generated tokens with how often each came, sorted by id (what the penalties read).
using TokenCounts = std::vector<std::pair<int32_t, int32_t>>;
// Counts one more `token`, keeping the order.
void count_token(TokenCounts& counts, int32_t token);
// The distinct ids of `tokens`, sorted (a prompt's, for the repetition penalty).
std::vector<int32_t> distinct_tokens(std::span<const int32_t> tokens);

// One row to draw: its request's parameters and the draw's place in its sequence.
struct SampleRequest {
  SamplingParams params;
  uint64_t seed = 0;
  int64_t position = 0;   // index in the sequence of the token being drawn
  int top_logprobs = 0;   // alternatives to report (0 .. ops::kMaxTopLogprobs)
  // The tokens generated so far and how often each came (distinct ids), for the penalties.
  std::span<const std::pair<int32_t, int32_t>> generated_counts;
  // The prompt's distinct ids, sorted (distinct_tokens): read only with a repetition penalty.
  std::span<const int32_t> prompt_tokens;
};

class BatchSampler {
 public:
  BatchSampler(ops::Backend& backend, int64_t max_rows);

  // One token per row of logits F32 [R, V] (R = rows.size()) on the backend's device. The
  // result is valid until the next call.
  std::span<const ops::SampledToken> sample(const ops::Context& ctx, TensorView logits,
                                            std::span<const SampleRequest> rows);
  // Seconds spent over all calls in the results' copy, waiting for the device to finish the
  // work queued before it (the step's forward): a step's wall time less its wait is host work
  // while the device idles.
  double wait_seconds() const { return wait_s_; }

 private:
  void reserve_penalties(int64_t n);

  ops::Backend& backend_;
  int64_t max_rows_;
  double wait_s_ = 0;
  std::unique_ptr<ops::Buffer> rows_host_, rows_dev_, out_host_, out_dev_;
  int64_t penalty_capacity_ = 0;
  std::unique_ptr<ops::Buffer> penalty_host_, penalty_dev_;  // [2, capacity]: ids, then counts
};

}  // namespace tetra::runtime
