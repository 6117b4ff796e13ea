// A ragged batch (sequences of different lengths, prefill and decode mixed) gives every
// sequence the logits it gets alone, on every attention the families have.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "fixtures.h"
#include "model/model.h"
#include "runtime/kv_cache.h"
#include "runtime/step_runner.h"

namespace tetra {
namespace {

std::vector<float> run(model::Model& m, ops::Backend& b, runtime::KvCache& cache,
                       const std::vector<runtime::SeqChunk>& chunks) {
  runtime::StepRunner runner(m, b, cache.block_size(),
                             {.max_tokens = 16, .max_seqs = 4, .max_blocks_per_seq = cache.n_blocks()});
  const int64_t vocab = m.config().vocab_size;
  auto logits = b.alloc(DType::F32, {int64_t(chunks.size()), vocab});
  runner.forward(chunks, cache.layers(), logits->view());
  std::vector<float> host(static_cast<size_t>(chunks.size() * size_t(vocab)));
  b.copy_to_host(host.data(), logits->view());
  return host;
}

class Batching : public ::testing::TestWithParam<std::string> {};

TEST_P(Batching, RaggedBatchEqualsSequencesAlone) {
  const auto dir = testing::fixtures_dir() / GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir / "config.json")) << dir << " is missing";
  auto backend = ops::make_cpu_backend(2);
  auto model = model::load_model(dir, *backend);
  const int bs = 4;
  const std::vector<int32_t> a = {5, 17, 42, 99, 3, 8, 21}, b = {7, 1, 250, 33, 2, 90};
  const std::vector<int32_t> blocks_a = {3, 0}, blocks_b = {1, 2};

  // Alone: A's first 5 tokens then its next 2; B whole.
  runtime::KvCache alone(*backend, model->kv_layout(), bs, 4);
  std::span<const int32_t> sa(a), sb(b);
  run(*model, *backend, alone, {{sa.subspan(0, 5), 0, blocks_a}});
  auto want_a = run(*model, *backend, alone, {{sa.subspan(5), 5, blocks_a}});
  auto want_b = run(*model, *backend, alone, {{sb, 0, blocks_b}});

  // Together: A's prefix alone, then A's 2-token chunk beside B's whole prompt in one step.
  runtime::KvCache together(*backend, model->kv_layout(), bs, 4);
  run(*model, *backend, together, {{sa.subspan(0, 5), 0, blocks_a}});
  auto both = run(*model, *backend, together, {{sa.subspan(5), 5, blocks_a}, {sb, 0, blocks_b}});
  const size_t vocab = want_a.size();
  for (size_t i = 0; i < vocab; ++i) {
    ASSERT_NEAR(both[i], want_a[i], 1e-5f) << i;
    ASSERT_NEAR(both[vocab + i], want_b[i], 1e-5f) << i;
  }
}

// GQA, and the MLA families: with and without q_lora, and the DSA indexer (its top-k of 4
// keys leaves A's first 4 positions dense and the later ones of A and B sparse).
INSTANTIATE_TEST_SUITE_P(Fixtures, Batching,
                         ::testing::Values("qwen3_moe-tiny", "deepseek_v3-tiny", "deepseek_v3-noqlora",
                                           "glm4_moe_lite-tiny", "glm_moe_dsa-tiny"),
                         testing::fixture_test_name);

}  // namespace
}  // namespace tetra
