// The batch sampler's penalty lists, as the backend receives them: output tokens with their
// counts for presence and frequency, the prompt's tokens (count 0 where not generated) merged
// in only for a repetition penalty, nothing for a row without penalties; and the tokens the
// CPU backend then draws from them.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "ops/forwarding_backend.h"
#include "runtime/sampler.h"

namespace tetra::runtime {
namespace {

using Entries = std::vector<std::pair<int32_t, int32_t>>;

// Records each row's penalty entries at every sample call.
class RecordingBackend : public ops::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<Entries> rows;

  void sample(const ops::Context& c, TensorView logits, TensorView recs, TensorView ids, TensorView counts,
              TensorView out) override {
    std::vector<ops::SamplingRow> host(size_t(logits.dim(0)));
    copy_to_host(host.data(), recs);
    std::vector<int32_t> id(size_t(ids.numel())), count(size_t(counts.numel()));
    if (!id.empty()) {
      copy_to_host(id.data(), ids);
      copy_to_host(count.data(), counts);
    }
    rows.clear();
    for (const ops::SamplingRow& r : host) {
      Entries e;
      for (int32_t i = r.penalty_begin; i < r.penalty_begin + r.penalty_count; ++i)
        e.push_back({id[size_t(i)], count[size_t(i)]});
      rows.push_back(e);
    }
    ForwardingBackend::sample(c, logits, recs, ids, counts, out);
  }
};

TEST(BatchSampler, PenaltyListsCarryThePromptOnlyForARepetitionPenalty) {
  auto cpu = ops::make_cpu_backend(1);
  RecordingBackend backend(*cpu);
  BatchSampler sampler(backend, 4);
  const int64_t vocab = 8;
  auto logits = backend.alloc(DType::F32, {4, vocab});
  std::vector<float> host(size_t(4 * vocab));
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < vocab; ++v) host[size_t(r * vocab + v)] = float(v);  // greedy: id 7 unless penalized
  backend.copy_from_host(logits->view(), host.data());

  const std::vector<int32_t> prompt = distinct_tokens(std::vector<int32_t>{7, 2, 7, 5, 2});
  EXPECT_EQ(prompt, (std::vector<int32_t>{2, 5, 7}));
  TokenCounts generated;
  for (int32_t t : {6, 3, 6, 5}) count_token(generated, t);
  EXPECT_EQ(generated, (Entries{{3, 1}, {5, 1}, {6, 2}}));

  std::vector<SampleRequest> rows(4);
  for (auto& r : rows) r.generated_counts = generated, r.prompt_tokens = prompt;
  rows[1].params.presence_penalty = 100.0f;
  rows[2].params.repetition_penalty = 100.0f;
  rows[3].params.repetition_penalty = 100.0f;
  rows[3].params.frequency_penalty = 1.0f;
  const auto out = sampler.sample(backend.context(), logits->view(), rows);

  ASSERT_EQ(backend.rows.size(), 4u);
  EXPECT_EQ(backend.rows[0], Entries{});
  EXPECT_EQ(backend.rows[1], (Entries{{3, 1}, {5, 1}, {6, 2}}));                  // output only
  EXPECT_EQ(backend.rows[2], (Entries{{2, 0}, {3, 1}, {5, 1}, {6, 2}, {7, 0}}));  // 5: prompt and output
  EXPECT_EQ(backend.rows[3], backend.rows[2]);
  EXPECT_EQ(out[0].token, 7);
  EXPECT_EQ(out[1].token, 7);  // the prompt's 7 is not an output token
  EXPECT_EQ(out[2].token, 4);  // 7, 6 and 5 are divided by 100; 4 leads
  EXPECT_EQ(out[3].token, 4);
}

}  // namespace
}  // namespace tetra::runtime
