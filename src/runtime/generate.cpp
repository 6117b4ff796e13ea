#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/kv_cache.h"
#include "runtime/sampler.h"

namespace tetra::runtime {
namespace {

void fingerprint_add(uint32_t& h, const std::vector<float>& values) {
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int i = 0; i < 4; ++i) h = (h ^ ((bits >> (8 * i)) & 0xffu)) * 16777619u;
  }
}

}  // namespace

void check_prompt(const ModelConfig& config, const std::vector<int32_t>& prompt,
                  int64_t max_new_tokens) {
  TETRA_CHECK(!prompt.empty(), "the prompt has no tokens");
  for (int32_t id : prompt)
    TETRA_CHECK(id >= 0 && id < config.vocab_size, "prompt token id ", id,
                " is outside the vocabulary of ", config.vocab_size);
  const int64_t total = int64_t(prompt.size()) + max_new_tokens;
  TETRA_CHECK(total <= config.max_position_embeddings, "the prompt (", prompt.size(),
              " tokens) plus ", max_new_tokens, " new tokens exceeds the model's context of ",
              config.max_position_embeddings);
}

GenerateResult generate(model::Model& model, ops::Backend& backend,
                        const std::vector<int32_t>& prompt, const GenerateOptions& options) {
  ModelRanks ranks(model, backend);
  return generate(ranks, prompt, options);
}

GenerateResult generate(ModelRanks& ranks, const std::vector<int32_t>& prompt, const GenerateOptions& options) {
  model::Model& model = ranks.model();
  ops::Backend& backend = ranks.backend();
  const ModelConfig& config = model.config();
  check_prompt(config, prompt, options.max_new_tokens);
  const int64_t total = int64_t(prompt.size()) + options.max_new_tokens;

  const int bs = options.block_size;
  const int64_t n_blocks = (total + bs - 1) / bs;
  RankCaches cache(ranks, bs, n_blocks);
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) blocks[size_t(b)] = int32_t(b);
  RankSteps steps(ranks, bs, {.max_tokens = int64_t(prompt.size()), .max_seqs = 1, .max_blocks_per_seq = n_blocks});
  BatchSampler sampler(backend, 1);
  auto logits_buf = backend.alloc(DType::F32, {1, config.vocab_size});
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));

  GenerateResult r;
  r.logits_fingerprint = 2166136261u;
  r.finish_reason = "length";
  std::vector<int32_t> sequence = prompt;
  TokenCounts counts;  // generated tokens, for the penalties
  const std::vector<int32_t> prompt_distinct =
      options.sampling.repetition_penalty != 1.0f ? distinct_tokens(prompt) : std::vector<int32_t>{};
  const auto t0 = std::chrono::steady_clock::now();
  int64_t cached = 0;  // tokens of `sequence` already written to the cache
  while (int64_t(r.token_ids.size()) < options.max_new_tokens) {
    SeqChunk chunk{.tokens = std::span<const int32_t>(sequence).subspan(size_t(cached)),
                   .start_position = cached,
                   .blocks = blocks};
    steps.forward({chunk}, cache, logits_buf->view());
    const SampleRequest row{.params = options.sampling,
                            .seed = options.seed,
                            .position = int64_t(sequence.size()),
                            .generated_counts = counts,
                            .prompt_tokens = prompt_distinct};
    const ops::SampledToken s = sampler.sample(steps.context(), logits_buf->view(), {&row, 1})[0];
    // The fingerprint covers every logit: the plain loop pays the copy, serving never does.
    backend.copy_to_host(logits.data(), logits_buf->view());
    if (cached == 0)
      r.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cached = int64_t(sequence.size());
    fingerprint_add(r.logits_fingerprint, logits);
    r.token_ids.push_back(s.token);
    r.logprobs.push_back(s.logprob);
    sequence.push_back(s.token);
    count_token(counts, s.token);
    const auto& eos = config.eos_token_ids;
    if (!options.ignore_eos && std::find(eos.begin(), eos.end(), s.token) != eos.end()) {
      r.finish_reason = "stop";
      break;
    }
  }
  r.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tetra::runtime
