// tetra eval's scoring: perplexity agrees with transformers' log-probs on a fixture, a model
// compared with itself has zero KL and full top-1 agreement, and an NVFP4 copy made by
// tetra quantize drifts a little from its BF16 original.
#include "runtime/evaluate.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/quantize_checkpoint.h"
#include "model/model.h"
#include "ops/ops.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

const fs::path kFixture = fs::path(TETRA_SOURCE_DIR) / "tests" / "fixtures" / "qwen3_moe-tiny";

struct Case {
  std::vector<int32_t> prompt, generated;
  std::vector<double> logprobs;
};

Case first_case() {
  std::ifstream in(kFixture / "expected.json");
  const auto j = nlohmann::json::parse(in);
  const auto& c = j.at("cases").at(0);
  return {c.at("prompt_ids").get<std::vector<int32_t>>(),
          c.at("token_ids").get<std::vector<int32_t>>(),
          c.at("logprobs").get<std::vector<double>>()};
}

TEST(Evaluate, NllDifferencesAreTransformersLogprobs) {
  ASSERT_TRUE(fs::exists(kFixture / "model.safetensors")) << "the fixture is missing";
  auto backend = ops::make_cpu_backend(2);
  auto model = model::load_model(kFixture, *backend);
  const Case c = first_case();
  std::vector<int32_t> seq = c.prompt;
  runtime::EvalOptions opt;
  double prev = runtime::evaluate(*model, nullptr, *backend, seq, opt).nll_sum;
  // Appending generated token k adds exactly -log p(token k | prompt, tokens < k).
  for (size_t k = 0; k < c.generated.size(); ++k) {
    seq.push_back(c.generated[k]);
    const runtime::EvalResult r = runtime::evaluate(*model, nullptr, *backend, seq, opt);
    EXPECT_NEAR(prev - r.nll_sum, c.logprobs[k], 2e-4) << "token " << k;
    EXPECT_EQ(r.n_scored, int64_t(seq.size()) - 1);
    EXPECT_NEAR(r.perplexity, std::exp(r.nll_sum / double(r.n_scored)), 1e-9);
    prev = r.nll_sum;
  }
}

TEST(Evaluate, AModelAgreesWithItselfAndWindowsRestart) {
  ASSERT_TRUE(fs::exists(kFixture / "model.safetensors")) << "the fixture is missing";
  auto backend = ops::make_cpu_backend(2);
  auto a = model::load_model(kFixture, *backend);
  auto b = model::load_model(kFixture, *backend);
  const Case c = first_case();
  std::vector<int32_t> seq = c.prompt;
  seq.insert(seq.end(), c.generated.begin(), c.generated.end());
  runtime::EvalOptions opt;
  opt.window = 7;  // several windows, the last one short
  int64_t progress_calls = 0;
  opt.on_progress = [&](int64_t, int64_t) { ++progress_calls; };
  const runtime::EvalResult r = runtime::evaluate(*a, b.get(), *backend, seq, opt);
  const int64_t n = int64_t(seq.size());
  EXPECT_EQ(r.n_scored, (n / 7) * 6 + std::max<int64_t>(0, n % 7 - 1));
  EXPECT_GE(progress_calls, 2);
  EXPECT_TRUE(r.has_ref);
  EXPECT_EQ(r.top1_agree, r.n_scored);
  EXPECT_LT(r.mean_kl, 1e-12);
  EXPECT_DOUBLE_EQ(r.perplexity, r.ref_perplexity);
  EXPECT_THROW(runtime::evaluate(*a, nullptr, *backend, {1}, opt), Error);
  EXPECT_THROW(runtime::evaluate(*a, nullptr, *backend, {1, 1 << 30}, opt), Error);
}

TEST(Evaluate, QuantizedCopyStaysCloseToItsOriginal) {
  ASSERT_TRUE(fs::exists(kFixture / "model.safetensors")) << "the fixture is missing";
  const fs::path out = fs::temp_directory_path() / ("tetra_eval_test_" + std::to_string(::getpid()));
  fs::remove_all(out);
  QuantizeOptions q;
  q.src = kFixture;
  q.dst = out;
  quantize_checkpoint(q);
  auto backend = ops::make_cpu_backend(2);
  auto bf16 = model::load_model(kFixture, *backend);
  auto nvfp4 = model::load_model(out, *backend);
  const Case c = first_case();
  std::vector<int32_t> seq = c.prompt;
  seq.insert(seq.end(), c.generated.begin(), c.generated.end());
  const runtime::EvalResult r = runtime::evaluate(*nvfp4, bf16.get(), *backend, seq, {});
  fs::remove_all(out);
  std::printf("NVFP4 vs BF16: ppl %.4f vs %.4f, mean KL %.6f, top-1 agreement %.3f\n",
              r.perplexity, r.ref_perplexity, r.mean_kl, r.top1_agreement);
  EXPECT_GT(r.mean_kl, 1e-6);   // NVFP4 weights change the distribution
  EXPECT_LT(r.mean_kl, 0.5);    // but not by much on a tiny random model
  EXPECT_GE(r.top1_agreement, 0.5);
  EXPECT_TRUE(std::isfinite(r.perplexity));
}

std::string python_with_numpy() {
  for (const char* py : {"/usr/bin/python3", "python3"})
    if (std::system((std::string(py) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0)
      return py;
  return "";
}

// The CPU backend runs an NVFP4 checkpoint as its dequantized weights: the same model with each
// quantized weight stored as F32 (tools/nvfp4_ref.py dequantize) gives the same distributions.
TEST(Evaluate, Nvfp4CheckpointRunsAsItsDequantizedWeights) {
  const std::string py = python_with_numpy();
  ASSERT_FALSE(py.empty()) << "python3 with numpy is missing (scripts/setup installs python3-numpy)";
  const fs::path tmp = fs::temp_directory_path() / ("tetra_deq_test_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  QuantizeOptions q;
  q.src = kFixture;
  q.dst = tmp / "nvfp4";
  quantize_checkpoint(q);
  const std::string cmd = py + " " + TETRA_SOURCE_DIR + "/tools/nvfp4_ref.py dequantize --model " +
                          kFixture.string() + " --quantized " + q.dst.string() + " --out " +
                          (tmp / "f32").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto backend = ops::make_cpu_backend(2);
  auto nvfp4 = model::load_model(q.dst, *backend);
  auto f32 = model::load_model(tmp / "f32", *backend);
  const Case c = first_case();
  std::vector<int32_t> seq = c.prompt;
  seq.insert(seq.end(), c.generated.begin(), c.generated.end());
  const runtime::EvalResult r = runtime::evaluate(*nvfp4, f32.get(), *backend, seq, {});
  fs::remove_all(tmp);
  std::printf("NVFP4 vs its dequantized F32 weights: mean KL %.3g, max %.3g, ppl %.9g vs %.9g\n",
              r.mean_kl, r.max_kl, r.perplexity, r.ref_perplexity);
  EXPECT_EQ(r.top1_agree, r.n_scored);
  // Bit-exact: the backend decodes codes times f32(scale * weight_scale_2), as the reference
  // dequantizes, and then runs the very arithmetic of the F32 model.
  EXPECT_EQ(r.max_kl, 0.0);
  EXPECT_EQ(r.perplexity, r.ref_perplexity);
}

}  // namespace
}  // namespace tetra
