// Shared pieces of the engine tests: a tiny fixture model (qwen3_moe-tiny unless another is
// named), prompts, and a collector that gathers every request's streamed outputs.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace tetra::testing {

inline std::filesystem::path tiny_model_dir() {
  return std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures" / "qwen3_moe-tiny";
}

struct TinyModel {
  TinyModel() : TinyModel(tiny_model_dir()) {}
  explicit TinyModel(const std::filesystem::path& dir) : model(model::load_model(dir, *backend)) {}
  std::unique_ptr<ops::Backend> backend = ops::make_cpu_backend(2);
  std::unique_ptr<model::Model> model;
  int64_t vocab() const { return model->config().vocab_size; }
};

// Random prompt of n token ids, never an EOS id (a prompt may hold one, but this keeps the
// prompts ordinary).
inline std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> pick(0, int32_t(vocab) - 4);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = pick(rng);
  return p;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top;
  runtime::FinishReason finish = runtime::FinishReason::None;
  int finishes = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Records outputs by request id. Used from the engine thread only, or guarded by the caller.
struct Collector {
  std::map<uint64_t, Collected> by_id;

  runtime::OutputCallback callback() {
    return [this](const runtime::RequestOutput& o) {
      Collected& c = by_id[o.request_id];
      for (const auto& t : o.tokens) {
        c.tokens.push_back(t.token);
        c.logprobs.push_back(t.logprob);
        c.top.push_back(t.top_logprobs);
      }
      if (o.finish != runtime::FinishReason::None) {
        c.finish = o.finish;
        ++c.finishes;
      }
      c.cached_prompt_tokens = o.cached_prompt_tokens;
      c.completion_tokens = o.completion_tokens;
    };
  }
};

// The engine's defaults with a small KV pool: zeroing the default 256 MiB on every test's
// engine would dominate the run time.
inline runtime::EngineConfig small_config() {
  runtime::EngineConfig c;
  c.kv_blocks = 256;
  return c;
}

inline uint64_t submit_ok(runtime::Engine& engine, runtime::RequestParams p, Collector& out) {
  const auto r = engine.submit(std::move(p), out.callback());
  EXPECT_EQ(r.error, runtime::SubmitError::None) << r.message;
  return r.request_id;
}

inline void drain(runtime::Engine& engine) {
  while (engine.step()) {
  }
}

inline runtime::GenerateResult reference(TinyModel& m, const runtime::RequestParams& p) {
  runtime::GenerateOptions o{.max_new_tokens = p.max_new_tokens, .sampling = p.sampling,
                             .seed = p.seed, .ignore_eos = p.ignore_eos};
  return runtime::generate(*m.model, *m.backend, p.prompt, o);
}

// A request's outputs against the same request run alone through generate(): the same tokens,
// log-probs within 1e-5, one finish. (The CPU backend computes each row as it would alone, so
// today they are bit-identical; a wrong key, position or sequence moves them by tenths.)
inline void expect_matches_generate(TinyModel& m, const runtime::RequestParams& p, const Collected& got,
                                    const std::string& what) {
  const auto want = reference(m, p);
  EXPECT_EQ(got.tokens, want.token_ids) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  for (size_t i = 0; i < want.logprobs.size(); ++i)
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-5) << what << " token " << i;
  EXPECT_EQ(got.finishes, 1) << what;
  EXPECT_EQ(got.finish, want.finish_reason == "stop" ? runtime::FinishReason::Stop : runtime::FinishReason::Length)
      << what;
}

inline runtime::RequestParams greedy(std::vector<int32_t> prompt, int64_t max_new,
                                     bool ignore_eos = true) {
  runtime::RequestParams p;
  p.prompt = std::move(prompt);
  p.max_new_tokens = max_new;
  p.ignore_eos = ignore_eos;
  return p;
}

}  // namespace tetra::testing
