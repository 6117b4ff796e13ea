// Next-token choice from one row of logits: greedy at temperature 0, otherwise temperature,
// top-k and top-p sampling from a seeded generator, so the same seed gives the same text.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tetra::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 = all tokens
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
};

struct Sample {
  int32_t token = 0;
  float logprob = 0.0f;  // natural log-probability under the model's unmodified distribution
};

// log_softmax(logits)[token], computed in double for a stable reference.
float token_logprob(std::span<const float> logits, int32_t token);

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}

  // `counts` (optional, [vocab]) holds how often each token was generated so far, for the
  // presence and frequency penalties.
  Sample sample(std::span<const float> logits, const SamplingParams& params,
                std::span<const int32_t> counts = {});

 private:
  std::mt19937_64 rng_;
  std::vector<float> scratch_;
  std::vector<int32_t> order_;
};

}  // namespace tetra::runtime
