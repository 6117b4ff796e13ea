// Generation for one sequence, start to finish: prefill the prompt, then decode token by
// token with the KV cache. The serving engine batches many of these; this is the plain loop
// that `tetra generate` and the parity tests run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/ranks.h"
#include "runtime/sampler.h"

namespace tetra::runtime {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool ignore_eos = false;
  int block_size = 16;
};

struct GenerateResult {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::string finish_reason;   // "stop" (an EOS token) or "length"
  double prefill_seconds = 0;
  double total_seconds = 0;
  uint32_t logits_fingerprint = 0;  // FNV-1a over every logit produced
};

// Checks a prompt against the model's config (non-empty, ids in the vocabulary, prompt plus
// new tokens within the context); throws tetra::Error with one sentence. Needs no weights.
void check_prompt(const ModelConfig& config, const std::vector<int32_t>& prompt,
                  int64_t max_new_tokens);

GenerateResult generate(model::Model& model, ops::Backend& backend,
                        const std::vector<int32_t>& prompt, const GenerateOptions& options);
// The same over a model's ranks (--tp/--ep): every rank steps, rank 0's logits are sampled.
GenerateResult generate(ModelRanks& ranks, const std::vector<int32_t>& prompt, const GenerateOptions& options);

}  // namespace tetra::runtime
