// --kv-cache-dtype fp8_e4m3 on every fixture: generation with an E4M3 KV cache (scale 1) stays
// close to the F32 cache's (the CPU's `auto`), and where the greedy tokens part the F32 cache's
// top two were within the FP8 error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <unistd.h>

#include "fixtures.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "model/model.h"
#include "runtime/evaluate.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "teacher_forced_kl.h"
#include "runtime/ranks.h"

namespace tetra {
namespace {

// E4M3 keeps 3 mantissa bits: each cached value moves by up to 2^-4 of itself (6.25%; 3.6%
// r.m.s.), and the fixtures' random weights amplify that: their next-token distributions are
// sharp (log-probs spread over several nats) and nothing was trained to be smooth. Measured on
// the fixtures' cases (2026-12-02): the mean |dlogprob| over the tokens both caches share is at
// most 0.11 nats a fixture (0.03-0.07 typical; 0.20 for glm_moe_dsa-tiny over the 3 tokens before
// it parts), the largest single one 1.55 (deepseek_v3-tiny, a token still the top one in both).
// So the bounds: mean 0.3, any one token 2.0 (a cache read from the
// wrong slot or not at all is off by whole nats on most tokens, which the mean catches), and
// where the greedy tokens part the F32 cache's top two lie within twice the single-token bound.
// The DSA fixtures (index_topk 4 of up to 40 keys) are there too: a rounded index key can swap
// which 4 keys a token reads, so they part sooner, but a parting still needs a near tie.
constexpr double kMeanLogprobTolerance = 0.3;
constexpr double kLogprobTolerance = 2.0;

// -log p of the last token of `tokens` given the rest, under `model`'s own cache.
double last_token_nll(model::Model& model, ops::Backend& backend, const std::vector<int32_t>& tokens) {
  auto head = tokens;
  head.pop_back();
  runtime::EvalOptions opt{.window = int64_t(tokens.size())};
  const double all = runtime::evaluate(model, nullptr, backend, tokens, opt).nll_sum;
  const double before = head.size() < 2 ? 0.0 : runtime::evaluate(model, nullptr, backend, head, opt).nll_sum;
  return all - before;
}

// The fixture loaded twice: on a CPU backend with its F32 cache, and on one with an E4M3 cache.
class Fp8KvCache : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    m32 = model::load_model(dir, *f32);
    m8 = model::load_model(dir, *fp8);
  }
  const std::filesystem::path dir = testing::fixtures_dir() / GetParam();
  std::unique_ptr<ops::Backend> f32 = ops::make_cpu_backend(2), fp8 = ops::make_cpu_backend(2, DType::F8_E4M3);
  std::unique_ptr<model::Model> m32, m8;
};

TEST_P(Fp8KvCache, GenerationStaysCloseToTheF32Cache) {
  const auto cases = testing::read_cases(dir);
  ASSERT_FALSE(cases.empty());
  size_t shared = 0;
  double sum_all = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    runtime::GenerateOptions opts{.max_new_tokens = c.max_new_tokens, .ignore_eos = true};
    const auto r32 = runtime::generate(*m32, *f32, c.prompt_ids, opts);
    const auto r8 = runtime::generate(*m8, *fp8, c.prompt_ids, opts);
    ASSERT_EQ(r8.token_ids.size(), r32.token_ids.size());
    size_t n = 0;
    double worst = 0, sum = 0;
    for (; n < r8.token_ids.size() && r8.token_ids[n] == r32.token_ids[n]; ++n) {
      const double d = std::abs(double(r8.logprobs[n]) - r32.logprobs[n]);
      worst = std::max(worst, d);
      sum += d;
    }
    shared += n;
    sum_all += sum;
    EXPECT_LE(worst, kLogprobTolerance) << "case " << i << ": largest log-prob difference";
    std::printf("%s case %zu: %zu of %zu tokens equal, |dlogprob| max %.2e, mean %.2e\n", GetParam().c_str(), i,
                n, r8.token_ids.size(), worst, n ? sum / double(n) : 0.0);
    if (n == r8.token_ids.size()) continue;
    // Parted at n: under the F32 cache the FP8 run's token must be within the error of the
    // F32 run's (log p(a) - log p(b), from the two sequences' scores).
    std::vector<int32_t> seq = c.prompt_ids;
    seq.insert(seq.end(), r32.token_ids.begin(), r32.token_ids.begin() + std::ptrdiff_t(n));
    auto with_a = seq, with_b = seq;
    with_a.push_back(r32.token_ids[n]);
    with_b.push_back(r8.token_ids[n]);
    const double margin = last_token_nll(*m32, *f32, with_b) - last_token_nll(*m32, *f32, with_a);
    EXPECT_LE(margin, 2 * kLogprobTolerance) << "case " << i << " parts at token " << n
                                              << " where the F32 cache's top two are " << margin << " apart";
    std::printf("  parts at token %zu: the F32 cache's top two %.2e apart\n", n, margin);
  }
  if (shared > 0) {
    EXPECT_LE(sum_all / double(shared), kMeanLogprobTolerance) << "mean |dlogprob| over " << shared << " tokens";
    std::printf("%s: mean |dlogprob| %.2e over %zu shared tokens\n", GetParam().c_str(), sum_all / double(shared),
                shared);
  }
}

// The same comparison teacher-forced: each case's prompt and transformers' continuation scored
// under both caches (runtime::evaluate, as `tetra eval --ref` does): the mean KL of the FP8
// cache's next-token distributions from the F32 cache's. Measured (2026-12-02): 0.003-0.06 nats
// on the GQA and plain MLA fixtures (bound 0.15); the DSA ones, whose top-4 key choice a rounded
// index key can change, 0.15 and 0.22 (bound 1.0). A misread cache gives KL of whole nats.
TEST_P(Fp8KvCache, TeacherForcedKlFromTheF32Cache) {
  const bool dsa = GetParam().starts_with("glm_moe_dsa");
  runtime::ModelRanks ranks8(*m8, *fp8), ranks32(*m32, *f32);
  const testing::TeacherForcedKl kl = testing::teacher_forced_kl(ranks8, ranks32, dir);
  std::printf("%s: mean KL(F32 cache || FP8 cache) %.2e nats over %lld predictions\n", GetParam().c_str(), kl.mean,
              static_cast<long long>(kl.scored));
  EXPECT_LE(kl.mean, dsa ? 1.0 : 0.15);
}

// A copy of qwen3_moe-tiny with ModelOpt's KV cache scales added: layer 0's on the projections
// (k_proj.k_scale, v_proj.v_scale), layer 1's on self_attn (k_scale, v_scale).
class CheckpointKvScales : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tetra_kv_scales_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::filesystem::copy_file(src_ / "config.json", dir_ / "config.json");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write(const std::vector<std::pair<std::string, float>>& scales) {
    auto ckpt = Checkpoint::open(src_);
    std::vector<TensorDecl> decls;
    for (const auto& name : ckpt->names()) {
      const TensorView v = ckpt->get(name);
      decls.push_back({name, v.dtype, v.shape});
    }
    for (const auto& [name, value] : scales) decls.push_back({name, DType::F32, Shape{}});
    SafetensorsWriter w(dir_ / "model.safetensors", decls);
    for (const auto& name : ckpt->names()) {
      const TensorView v = ckpt->get(name);
      w.write(name, v.data, uint64_t(v.nbytes()));
    }
    for (const auto& [name, value] : scales) w.write(name, &value, sizeof(float));
    w.finish();
  }

  const std::filesystem::path src_ = testing::fixtures_dir() / "qwen3_moe-tiny";
  std::filesystem::path dir_;
};

TEST_F(CheckpointKvScales, ReachTheCacheLayers) {
  write({{"model.layers.0.self_attn.k_proj.k_scale", 0.5f}, {"model.layers.0.self_attn.v_proj.v_scale", 2.0f},
         {"model.layers.1.self_attn.k_scale", 0.25f}, {"model.layers.1.self_attn.v_scale", 4.0f}});
  auto fp8 = ops::make_cpu_backend(2, DType::F8_E4M3);
  auto m = model::load_model(dir_, *fp8);
  const auto layout = m->kv_layout();
  ASSERT_GE(layout.size(), 2u);
  EXPECT_EQ(layout[0].k_scale, 0.5f);
  EXPECT_EQ(layout[0].v_scale, 2.0f);
  EXPECT_EQ(layout[1].k_scale, 0.25f);
  EXPECT_EQ(layout[1].v_scale, 4.0f);
  runtime::KvCache cache(*fp8, layout, 16, 4);
  EXPECT_EQ(cache.layers()[0].k_scale, 0.5f);
  EXPECT_EQ(cache.layers()[1].v_scale, 4.0f);
  EXPECT_EQ(cache.layers()[0].k.dtype, DType::F8_E4M3);
  // Scales of a few powers of two only move where E4M3 rounds: generation stays as close to
  // the F32 cache as with scale 1.
  auto f32 = ops::make_cpu_backend(2);
  auto m32 = model::load_model(src_, *f32);
  const auto c = testing::read_cases(src_).at(1);
  runtime::GenerateOptions opts{.max_new_tokens = c.max_new_tokens, .ignore_eos = true};
  const auto r8 = runtime::generate(*m, *fp8, c.prompt_ids, opts), r32 = runtime::generate(*m32, *f32, c.prompt_ids, opts);
  ASSERT_EQ(r8.token_ids.size(), r32.token_ids.size());
  for (size_t t = 0; t < r8.token_ids.size() && r8.token_ids[t] == r32.token_ids[t]; ++t)
    EXPECT_NEAR(r8.logprobs[t], r32.logprobs[t], kLogprobTolerance) << t;
}

TEST_F(CheckpointKvScales, ABadScaleIsOneSentence) {
  write({{"model.layers.0.self_attn.k_proj.k_scale", -1.0f}});
  auto fp8 = ops::make_cpu_backend(2, DType::F8_E4M3);
  try {
    model::load_model(dir_, *fp8);
    FAIL() << "a negative k_scale was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.k_proj.k_scale"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8KvCache,
                         ::testing::Values("qwen3_moe-tiny", "qwen3_moe-nonorm", "glm4_moe-tiny",
                                           "mixtral-tiny", "deepseek_v3-tiny", "deepseek_v3-noqlora",
                                           "glm4_moe_lite-tiny", "glm_moe_dsa-tiny", "qwen3_moe-tiny-nvfp4",
                                           "glm4_moe-tiny-nvfp4", "mixtral-tiny-nvfp4",
                                           "deepseek_v3-tiny-nvfp4", "glm4_moe_lite-tiny-nvfp4",
                                           "glm_moe_dsa-tiny-nvfp4"),
                         testing::fixture_test_name);

}  // namespace
}  // namespace tetra
