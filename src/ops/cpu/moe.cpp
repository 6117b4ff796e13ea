// MoE routing and experts on the CPU, following transformers' maths (FORMATS.md §2.2).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cpu/cpu_backend.h"

namespace tetra::ops::cpu {
namespace {

// Indices of the k largest values, largest first; ties keep the lower index (as a stable sort).
std::vector<int> top_k_indices(const std::vector<float>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

bool has_nvfp4(const MlpWeights& w) {
  return w.gate.format == WeightFormat::Nvfp4 || w.up.format == WeightFormat::Nvfp4 ||
         w.down.format == WeightFormat::Nvfp4;
}

// One expert linear: W4A8 for an NVFP4 weight when the experts take FP8 activations.
void expert_linear(ThreadPool* pool, const CpuExperts& experts, const float* x, int64_t n_tokens,
                   const LinearWeight& w, float* out) {
  if (experts.fp8_activations() && w.format == WeightFormat::Nvfp4)
    linear_w4a8(pool, x, n_tokens, w, out);
  else
    linear_f32(pool, x, n_tokens, w, out);
}

}  // namespace

CpuExperts::CpuExperts(std::vector<MlpWeights> experts, std::optional<MlpWeights> shared, bool fp8_activations,
                       std::vector<std::unique_ptr<Buffer>> storage)
    : experts_(std::move(experts)),
      shared_(std::move(shared)),
      fp8_activations_(fp8_activations),
      storage_(std::move(storage)) {
  // Only NVFP4 linears change; one kept in BF16 (a shared expert, or a width that is not a
  // multiple of 16) stays W16A16. Experts with none would make the flag a silent no-op.
  if (fp8_activations)
    TETRA_CHECK(std::any_of(experts_.begin(), experts_.end(), has_nvfp4),
                "--moe-activation-dtype fp8_e4m3 (W4A8) takes NVFP4 experts; this model's routed experts are not "
                "NVFP4 (quantize them with `tetra quantize`, or leave the flag at auto)");
}

void route(TensorView logits, const RoutingSpec& spec, TensorView ids, TensorView weights) {
  const int64_t n_tokens = logits.dim(0), n_experts = logits.dim(1);
  const int k = spec.top_k;
  TETRA_CHECK(k >= 1 && k <= n_experts, "route: top_k ", k, " is outside 1..", n_experts);
  std::vector<float> probs(static_cast<size_t>(n_experts)), choice(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits.as<const float>() + t * n_experts;
    if (spec.scoring == Scoring::Softmax) {
      const float m = *std::max_element(l, l + n_experts);
      float sum = 0;
      for (int64_t e = 0; e < n_experts; ++e) sum += (probs[size_t(e)] = std::exp(l[e] - m));
      for (auto& p : probs) p /= sum;
      choice = probs;
    } else {
      for (int64_t e = 0; e < n_experts; ++e) {
        probs[size_t(e)] = 1.0f / (1.0f + std::exp(-l[e]));
        choice[size_t(e)] = probs[size_t(e)] +
            (spec.correction_bias.empty() ? 0.0f : spec.correction_bias.as<const float>()[e]);
      }
      if (spec.n_group > 1) {
        // A group's score is the sum of its two best biased scores; experts of the groups
        // outside the best topk_group are masked with -inf, as transformers 5 does.
        const int64_t per_group = n_experts / spec.n_group;
        std::vector<float> group_score(static_cast<size_t>(spec.n_group));
        for (int g = 0; g < spec.n_group; ++g) {
          std::vector<float> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
          auto best = top_k_indices(members, std::min<int>(2, int(per_group)));
          float s = 0;
          for (int i : best) s += members[size_t(i)];
          group_score[size_t(g)] = s;
        }
        auto keep = top_k_indices(group_score, spec.topk_group);
        std::vector<bool> kept(size_t(spec.n_group), false);
        for (int g : keep) kept[size_t(g)] = true;
        for (int64_t e = 0; e < n_experts; ++e)
          if (!kept[size_t(e / per_group)]) choice[size_t(e)] = -INFINITY;
      }
    }
    auto chosen = top_k_indices(choice, k);
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += probs[size_t(chosen[size_t(j)])];
    const float denom = spec.scoring == Scoring::Sigmoid ? sum + 1e-20f : sum;
    for (int j = 0; j < k; ++j) {
      float w = probs[size_t(chosen[size_t(j)])];
      if (spec.norm_topk_prob) w /= denom;
      ids.as<int32_t>()[t * k + j] = chosen[size_t(j)];
      weights.as<float>()[t * k + j] = w * spec.routed_scaling_factor;
    }
  }
}

void moe_experts(ThreadPool* pool, TensorView x, TensorView ids, TensorView weights,
                 const CpuExperts& experts, TensorView out) {
  const int64_t n_tokens = x.dim(0), hidden = x.dim(1), k = ids.dim(1);
  const int64_t n_experts = experts.n_experts(), first = experts.first_expert();
  // Group the batch's tokens by expert, so each expert's weights are decoded once per step.
  // Under expert parallelism the ids of other ranks' experts are skipped.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(n_experts));  // (token * k + j) per expert
  for (int64_t i = 0; i < n_tokens * k; ++i) {
    const int32_t e = ids.as<const int32_t>()[i];
    TETRA_CHECK(e >= 0, "moe: expert id ", e, " is negative");
    if (e >= first && e < first + n_experts) slots[size_t(e - first)].push_back(i);
  }
  // Every (token, choice) gets its own output row; they are summed in expert order below,
  // which is the order transformers accumulates them in.
  std::vector<float> partial(size_t(n_tokens * k * hidden), 0.0f);
  for (int64_t e = 0; e < n_experts; ++e) {
    const auto& rows = slots[size_t(e)];
    if (rows.empty()) continue;
    const MlpWeights& w = experts.expert(e);
    const int64_t n = int64_t(rows.size()), inter = w.gate.n_out;
    std::vector<float> xs(static_cast<size_t>(n * hidden)), gate(static_cast<size_t>(n * inter)), up(static_cast<size_t>(n * inter)),
        down(size_t(n * hidden));
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x.as<const float>() + (rows[size_t(r)] / k) * hidden, hidden, xs.data() + r * hidden);
    expert_linear(pool, experts, xs.data(), n, w.gate, gate.data());
    expert_linear(pool, experts, xs.data(), n, w.up, up.data());
    for (int64_t i = 0; i < n * inter; ++i)
      gate[size_t(i)] = gate[size_t(i)] / (1.0f + std::exp(-gate[size_t(i)])) * up[size_t(i)];
    expert_linear(pool, experts, gate.data(), n, w.down, down.data());
    for (int64_t r = 0; r < n; ++r) {
      const float wgt = weights.as<const float>()[rows[size_t(r)]];
      float* dst = partial.data() + rows[size_t(r)] * hidden;
      for (int64_t i = 0; i < hidden; ++i) dst[i] = down[size_t(r * hidden + i)] * wgt;
    }
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<std::pair<int32_t, int64_t>> order;  // (expert, choice) of this token, ours only
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.as<const int32_t>()[t * k + j];
      if (e >= first && e < first + n_experts) order.emplace_back(e, j);
    }
    std::sort(order.begin(), order.end());
    float* o = out.as<float>() + t * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (auto [e, j] : order) {
      const float* src = partial.data() + (t * k + j) * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] += src[i];
    }
  }
  // The shared expert sees every token with weight 1 and is added last, as transformers adds it.
  if (const MlpWeights* shared = experts.shared()) {
    const int64_t inter = shared->gate.n_out;
    std::vector<float> gate(size_t(n_tokens * inter)), up(size_t(n_tokens * inter)),
        down(size_t(n_tokens * hidden));
    expert_linear(pool, experts, x.as<const float>(), n_tokens, shared->gate, gate.data());
    expert_linear(pool, experts, x.as<const float>(), n_tokens, shared->up, up.data());
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    expert_linear(pool, experts, gate.data(), n_tokens, shared->down, down.data());
    float* o = out.as<float>();
    for (int64_t i = 0; i < n_tokens * hidden; ++i) o[i] += down[size_t(i)];
  }
}

}  // namespace tetra::ops::cpu
