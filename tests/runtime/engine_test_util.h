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
  std::string error;  // the finishing output's, where it failed
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
        c.error = o.error;
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

// n requests: prompts of 1 + (7i + 3) mod 45 tokens (1 to 45), 3 to 16 new tokens each.
inline std::vector<runtime::RequestParams> mixed_requests(const TinyModel& m, int n, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<runtime::RequestParams> out;
  for (int i = 0; i < n; ++i)
    out.push_back(greedy(random_prompt(rng, 1 + (i * 7 + 3) % 45, m.vocab()), 3 + (i * 5) % 14));
  return out;
}

// Every request through one engine, each checked against itself alone through generate():
// all submitted before the first step, or (staggered) request i after i % 3 steps of the
// ones before it. The engine must end empty. `what` prefixes the failure messages.
inline runtime::EngineStats run_and_compare(TinyModel& m, const runtime::EngineConfig& config,
                                            const std::vector<runtime::RequestParams>& requests,
                                            bool staggered = false, const std::string& what = "") {
  runtime::Engine engine(*m.model, *m.backend, config);
  Collector out;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    ids.push_back(submit_ok(engine, requests[i], out));
    if (staggered)
      for (size_t k = 0; k < i % 3; ++k) engine.step();
  }
  drain(engine);
  for (size_t i = 0; i < requests.size(); ++i)
    expect_matches_generate(m, requests[i], out.by_id[ids[i]], what + "request " + std::to_string(i));
  const auto s = engine.stats();
  EXPECT_EQ(s.running, 0) << what;
  EXPECT_EQ(s.waiting, 0) << what;
  EXPECT_EQ(s.kv_blocks_used, 0) << what;
  return s;
}

}  // namespace tetra::testing
