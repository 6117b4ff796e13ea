// Model quality over a token stream (what `tetra eval` reports): perplexity, and against a
// reference model (the BF16 original of a quantized checkpoint) the mean KL divergence of the
// next-token distributions and how often both pick the same top-1 token, as llama.cpp's
// perplexity tool measures quantization quality.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"
#include "runtime/ranks.h"

namespace tetra::runtime {

struct EvalOptions {
  // The stream is cut into windows of this many tokens (at most the model's context); each
  // window is a fresh sequence and its positions 1.. are scored (position 0 has no context).
  int64_t window = 512;
  int block_size = 16;
  // After each window: tokens scored so far, total to score.
  std::function<void(int64_t, int64_t)> on_progress;
};

struct EvalResult {
  int64_t n_scored = 0;         // predictions scored
  double nll_sum = 0;           // sum of -log p(token | context), natural log
  double perplexity = 0;        // exp(nll_sum / n_scored)
  bool has_ref = false;
  double ref_perplexity = 0;
  double kl_sum = 0;            // sum over positions of KL(p_ref || p_model), nats
  double mean_kl = 0;
  double max_kl = 0;
  int64_t top1_agree = 0;       // positions where both models' argmax agree
  double top1_agreement = 0;    // top1_agree / n_scored
};

// Scores `tokens` under `model` and, when `ref` is given, compares with it position by
// position. Both models run on `backend`. Throws if a token is outside either vocabulary or
// the vocabularies differ.
EvalResult evaluate(model::Model& model, model::Model* ref, ops::Backend& backend,
                    const std::vector<int32_t>& tokens, const EvalOptions& options);
// The same with each model on its ranks (--tp/--ep).
EvalResult evaluate(ModelRanks& model, ModelRanks* ref, const std::vector<int32_t>& tokens,
                    const EvalOptions& options);

}  // namespace tetra::runtime
