#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tetra::runtime {

float token_logprob(std::span<const float> logits, int32_t token) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - m);
  return float(double(logits[size_t(token)]) - m - std::log(sum));
}

Sample Sampler::sample(std::span<const float> logits, const SamplingParams& p,
                       std::span<const int32_t> counts) {
  const int64_t vocab = int64_t(logits.size());
  scratch_.assign(logits.begin(), logits.end());
  if (!counts.empty() && (p.presence_penalty != 0 || p.frequency_penalty != 0)) {
    for (int64_t i = 0; i < vocab; ++i)
      if (counts[size_t(i)] > 0)
        scratch_[size_t(i)] -= p.presence_penalty + p.frequency_penalty * float(counts[size_t(i)]);
  }
  int32_t token;
  if (p.temperature <= 0.0f) {
    // The first maximum, as argmax picks it.
    token = int32_t(std::max_element(scratch_.begin(), scratch_.end()) - scratch_.begin());
  } else {
    order_.resize(size_t(vocab));
    std::iota(order_.begin(), order_.end(), 0);
    const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, vocab) : vocab;
    auto by_logit = [&](int32_t a, int32_t b) {
      return scratch_[size_t(a)] > scratch_[size_t(b)] || (scratch_[size_t(a)] == scratch_[size_t(b)] && a < b);
    };
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_logit);
    order_.resize(size_t(k));
    const float m = scratch_[size_t(order_[0])];
    std::vector<double> probs(order_.size());
    double sum = 0;
    for (size_t i = 0; i < order_.size(); ++i)
      sum += (probs[i] = std::exp(double(scratch_[size_t(order_[i])] - m) / p.temperature));
    // Nucleus: the shortest prefix of the sorted tokens whose mass reaches top_p.
    size_t keep = probs.size();
    if (p.top_p < 1.0f) {
      double acc = 0;
      for (size_t i = 0; i < probs.size(); ++i) {
        acc += probs[i] / sum;
        if (acc >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    const double kept_mass = std::accumulate(probs.begin(), probs.begin() + long(keep), 0.0);
    const double u = std::uniform_real_distribution<double>(0.0, kept_mass)(rng_);
    double acc = 0;
    token = order_[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      acc += probs[i];
      if (u < acc) {
        token = order_[i];
        break;
      }
    }
  }
  return {token, token_logprob(logits, token)};
}

}  // namespace tetra::runtime
