#include "runtime/evaluate.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>

#include "runtime/kv_cache.h"

namespace tetra::runtime {
namespace {

// Logits F32 [T, vocab] (on the host) of every position of one fresh sequence.
std::vector<float> window_logits(ModelRanks& ranks, std::span<const int32_t> tokens, int block_size) {
  model::Model& model = ranks.model();
  ops::Backend& backend = ranks.backend();
  const int64_t n = int64_t(tokens.size());
  const int64_t vocab = model.config().vocab_size;
  const int64_t n_blocks = (n + block_size - 1) / block_size;
  RankCaches cache(ranks, block_size, n_blocks);
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) blocks[size_t(b)] = int32_t(b);
  RankSteps steps(ranks, block_size, {.max_tokens = n, .max_seqs = 1, .max_blocks_per_seq = n_blocks});
  auto logits_buf = backend.alloc(DType::F32, {n, vocab});
  // Every row's logits, not only the last one's.
  steps.forward({SeqChunk{.tokens = tokens, .start_position = 0, .blocks = blocks, .every_logit = true}}, cache,
                logits_buf->view());
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  backend.copy_to_host(logits.data(), logits_buf->view());
  return logits;
}

// log_softmax of one row, in double.
void log_softmax(const float* logits, int64_t n, std::vector<double>& out) {
  out.resize(size_t(n));
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(logits[i]) - lse;
}

int64_t argmax(const std::vector<double>& v) {
  return int64_t(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

EvalResult evaluate(model::Model& model, model::Model* ref, ops::Backend& backend,
                    const std::vector<int32_t>& tokens, const EvalOptions& options) {
  ModelRanks ranks(model, backend);
  std::optional<ModelRanks> ref_ranks;
  if (ref) ref_ranks.emplace(*ref, backend);
  return evaluate(ranks, ref_ranks ? &*ref_ranks : nullptr, tokens, options);
}

EvalResult evaluate(ModelRanks& model_ranks, ModelRanks* ref_ranks, const std::vector<int32_t>& tokens,
                    const EvalOptions& options) {
  const model::Model& model = model_ranks.model();
  const model::Model* ref = ref_ranks ? &ref_ranks->model() : nullptr;
  const ModelConfig& c = model.config();
  const int64_t vocab = c.vocab_size;
  TETRA_CHECK(!ref || ref->config().vocab_size == vocab, "the reference model's vocabulary (",
              ref ? ref->config().vocab_size : 0, ") differs from the model's (", vocab, ")");
  for (int32_t t : tokens)
    TETRA_CHECK(t >= 0 && t < vocab, "token id ", t, " is outside the vocabulary of ", vocab);
  int64_t window = std::min<int64_t>(options.window, c.max_position_embeddings);
  if (ref) window = std::min<int64_t>(window, ref->config().max_position_embeddings);
  TETRA_CHECK(window >= 2, "an evaluation window needs at least 2 tokens");
  TETRA_CHECK(tokens.size() >= 2, "the text has ", tokens.size(),
              " tokens; evaluation needs at least 2");

  EvalResult r;
  r.has_ref = ref != nullptr;
  double ref_nll = 0;
  const int64_t n = int64_t(tokens.size());
  int64_t n_total = 0;
  for (int64_t w0 = 0; w0 < n; w0 += window) n_total += std::max<int64_t>(0, std::min(window, n - w0) - 1);
  std::vector<double> lp, lr;
  for (int64_t w0 = 0; w0 < n; w0 += window) {
    const int64_t len = std::min(window, n - w0);
    if (len < 2) break;
    const std::span<const int32_t> win(tokens.data() + w0, size_t(len));
    const std::vector<float> logits = window_logits(model_ranks, win, options.block_size);
    std::vector<float> ref_logits;
    if (ref) ref_logits = window_logits(*ref_ranks, win, options.block_size);
    // Row i predicts token i + 1.
    for (int64_t i = 0; i + 1 < len; ++i) {
      const int32_t next = win[size_t(i + 1)];
      log_softmax(logits.data() + i * vocab, vocab, lp);
      r.nll_sum -= lp[size_t(next)];
      ++r.n_scored;
      if (!ref) continue;
      log_softmax(ref_logits.data() + i * vocab, vocab, lr);
      ref_nll -= lr[size_t(next)];
      double kl = 0;
      for (int64_t v = 0; v < vocab; ++v) kl += std::exp(lr[size_t(v)]) * (lr[size_t(v)] - lp[size_t(v)]);
      kl = std::max(kl, 0.0);  // rounding can leave a tiny negative for identical models
      r.kl_sum += kl;
      r.max_kl = std::max(r.max_kl, kl);
      r.top1_agree += argmax(lp) == argmax(lr);
    }
    if (options.on_progress) options.on_progress(r.n_scored, n_total);
  }
  r.perplexity = std::exp(r.nll_sum / double(r.n_scored));
  if (ref) {
    r.ref_perplexity = std::exp(ref_nll / double(r.n_scored));
    r.mean_kl = r.kl_sum / double(r.n_scored);
    r.top1_agreement = double(r.top1_agree) / double(r.n_scored);
  }
  return r;
}

}  // namespace tetra::runtime
