// The serving engine against runtime::generate, the plain single-sequence loop: whatever the
// batch, chunking, preemption or decode-step grouping, greedy requests get the same tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"
#include "ops/forwarding_backend.h"
#include "runtime/decode_graphs.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::EngineConfig;
using runtime::FinishReason;
using runtime::RequestParams;
using testing::Collector;
using testing::expect_matches_generate;

using testing::mixed_requests;
using testing::run_and_compare;

TEST(Engine, GreedyAloneEqualsGenerate) {
  testing::TinyModel m;
  for (const auto& p : mixed_requests(m, 4)) run_and_compare(m, testing::small_config(), {p});
}

TEST(Engine, GreedyBatchOf16MixedLengthsEqualsGenerate) {
  testing::TinyModel m;
  const runtime::EngineStats s = run_and_compare(m, testing::small_config(), mixed_requests(m, 16));
  EXPECT_EQ(s.preemptions, 0);
  EXPECT_GT(s.generated_tokens, 0);
}

TEST(Engine, StaggeredArrivalsMixPrefillAndDecode) {
  // New prompts join while others decode, under a small prefill budget and a running cap:
  // steps mix decode tokens with prompt chunks, and nobody's tokens change.
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.chunked_prefill_size = 7;
  c.max_running_requests = 3;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  const auto requests = mixed_requests(m, 10, 6);
  std::vector<uint64_t> ids;
  int64_t most_running = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ids.push_back(testing::submit_ok(engine, requests[i], out));
    for (size_t k = 0; k < 1 + i % 3; ++k) {
      engine.step();
      most_running = std::max(most_running, engine.stats().running);
    }
  }
  while (engine.step()) most_running = std::max(most_running, engine.stats().running);
  EXPECT_EQ(most_running, 3);
  for (size_t i = 0; i < requests.size(); ++i)
    expect_matches_generate(m, requests[i], out.by_id[ids[i]], "request " + std::to_string(i));
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST(Engine, FrequencyPenaltyStopsRepeats) {
  // A penalty far above any logit gap forbids every token already generated; the prompt's
  // tokens are not penalised (OpenAI counts generated tokens only).
  testing::TinyModel m;
  Engine engine(*m.model, *m.backend, testing::small_config());
  Collector out;
  RequestParams p = testing::greedy({7, 7, 7, 7}, 40);
  p.sampling.frequency_penalty = 1000.0f;
  const auto id = testing::submit_ok(engine, p, out);
  RequestParams plain = testing::greedy({7, 7, 7, 7}, 40);
  const auto plain_id = testing::submit_ok(engine, plain, out);
  testing::drain(engine);
  auto tokens = out.by_id[id].tokens;
  ASSERT_EQ(tokens.size(), 40u);
  std::sort(tokens.begin(), tokens.end());
  EXPECT_EQ(std::adjacent_find(tokens.begin(), tokens.end()), tokens.end()) << "a token repeats";
  // Without the penalty this tiny random model does repeat itself within 40 tokens.
  auto plain_tokens = out.by_id[plain_id].tokens;
  std::sort(plain_tokens.begin(), plain_tokens.end());
  EXPECT_NE(std::adjacent_find(plain_tokens.begin(), plain_tokens.end()), plain_tokens.end());
}

TEST(Engine, RepetitionPenaltyKeepsThePromptsAndTheOutputsTokensOut) {
  // vLLM's repetition penalty reads the prompt's tokens too. The prompt here ends with the
  // first tokens greedy decoding gives, which the model goes on to repeat; a penalty of 1e30
  // takes every positive logit of a seen token to about 0 and every negative one far below, so
  // (this model always having some unseen token above 0) no seen token comes again.
  testing::TinyModel m;
  Engine engine(*m.model, *m.backend, testing::small_config());
  Collector out;
  std::vector<int32_t> prompt = {5, 6, 7, 8};
  const auto first = testing::reference(m, testing::greedy(prompt, 8)).token_ids;
  prompt.insert(prompt.end(), first.begin(), first.end());
  RequestParams p = testing::greedy(prompt, 40);
  p.sampling.repetition_penalty = 1e30f;
  const auto id = testing::submit_ok(engine, p, out);
  const auto plain_id = testing::submit_ok(engine, testing::greedy(prompt, 40), out);
  testing::drain(engine);
  auto seen = [&](const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens)
      if (std::find(prompt.begin(), prompt.end(), t) != prompt.end()) return true;
    return false;
  };
  auto tokens = out.by_id[id].tokens;
  ASSERT_EQ(tokens.size(), 40u);
  EXPECT_FALSE(seen(tokens)) << "a prompt token came back";
  std::sort(tokens.begin(), tokens.end());
  EXPECT_EQ(std::adjacent_find(tokens.begin(), tokens.end()), tokens.end()) << "a token repeats";
  EXPECT_TRUE(seen(out.by_id[plain_id].tokens)) << "without the penalty the model repeats its prompt";
  // generate's single-sequence loop applies the same rule.
  EXPECT_EQ(testing::reference(m, p).token_ids, out.by_id[id].tokens);
}

TEST(Engine, EosEndsARequestWithStopUnlessIgnored) {
  // The fixture again, with its eos_token_id set to the third token greedy decoding of this
  // prompt produces, so the stop is certain.
  testing::TinyModel m;
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  const auto free_run = testing::reference(m, testing::greedy(prompt, 3));
  const int32_t eos = free_run.token_ids[2];
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tetra-eos-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                    "-" + std::to_string(eos));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(testing::tiny_model_dir() / "model.safetensors", dir / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  {
    std::ifstream in(testing::tiny_model_dir() / "config.json");
    auto config = nlohmann::json::parse(in);
    config["eos_token_id"] = eos;
    std::ofstream(dir / "config.json") << config.dump();
  }
  auto model = model::load_model(dir, *m.backend);
  Engine engine(*model, *m.backend, testing::small_config());
  Collector out;
  const auto stops = testing::submit_ok(engine, testing::greedy(prompt, 10, /*ignore_eos=*/false), out);
  const auto ignores = testing::submit_ok(engine, testing::greedy(prompt, 10, /*ignore_eos=*/true), out);
  testing::drain(engine);
  std::filesystem::remove_all(dir);
  // The EOS token is delivered, then the request ends.
  auto want = free_run.token_ids;
  want.erase(std::find(want.begin(), want.end(), eos) + 1, want.end());
  EXPECT_EQ(out.by_id[stops].tokens, want);
  EXPECT_EQ(out.by_id[stops].finish, FinishReason::Stop);
  EXPECT_EQ(out.by_id[ignores].tokens.size(), 10u);
  EXPECT_EQ(out.by_id[ignores].finish, FinishReason::Length);
}

TEST(Engine, ChunkedPrefillOf3EqualsUnchunked) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.chunked_prefill_size = 3;
  const runtime::EngineStats s = run_and_compare(m, c, mixed_requests(m, 8, 2));
  // Each step holds at most 3 prompt tokens, so the prompts took many steps.
  int64_t prompt_total = 0;
  for (const auto& p : mixed_requests(m, 8, 2)) prompt_total += int64_t(p.prompt.size());
  EXPECT_GE(s.steps, prompt_total / 3);
}

TEST(Engine, PreemptionByRecomputeKeepsGreedyTokens) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.kv_blocks = 14;  // one request needs up to 11 blocks; four at once cannot fit
  std::mt19937 rng(3);
  std::vector<RequestParams> requests;
  for (int i = 0; i < 4; ++i)
    requests.push_back(testing::greedy(testing::random_prompt(rng, 10 + 3 * i, m.vocab()), 20));
  const runtime::EngineStats s = run_and_compare(m, c, requests);
  EXPECT_GT(s.preemptions, 0);
  std::printf("%lld preemptions, %lld steps\n", (long long)s.preemptions, (long long)s.steps);
}

TEST(Engine, ContinuousDecodeStepsGiveTheSameTokens) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.num_continuous_decode_steps = 4;
  const runtime::EngineStats s4 = run_and_compare(m, c, mixed_requests(m, 6, 4));
  c.num_continuous_decode_steps = 1;
  const runtime::EngineStats s1 = run_and_compare(m, c, mixed_requests(m, 6, 4));
  EXPECT_EQ(s4.generated_tokens, s1.generated_tokens);
}

TEST(Engine, SameSeedSameTokensInAnyBatch) {
  testing::TinyModel m;
  RequestParams p = testing::greedy({11, 22, 33, 44, 55}, 24);
  p.sampling.temperature = 0.8f;
  p.sampling.top_p = 0.95f;
  p.seed = 1234;
  const auto want = testing::reference(m, p);
  // Four copies in one batch beside other seeded requests, then one alone.
  Engine engine(*m.model, *m.backend, testing::small_config());
  Collector out;
  std::vector<uint64_t> ids;
  std::mt19937 rng(5);
  for (int i = 0; i < 4; ++i) {
    ids.push_back(testing::submit_ok(engine, p, out));
    RequestParams other = testing::greedy(testing::random_prompt(rng, 7 + i, m.vocab()), 9);
    other.sampling.temperature = 1.0f;
    other.seed = uint64_t(i);
    testing::submit_ok(engine, other, out);
  }
  testing::drain(engine);
  ids.push_back(testing::submit_ok(engine, p, out));
  testing::drain(engine);
  for (uint64_t id : ids) EXPECT_EQ(out.by_id[id].tokens, want.token_ids) << "request " << id;
  // A different seed gives different text (24 tokens at temperature 0.8 agree by chance
  // with negligible probability).
  p.seed = 99;
  const auto id = testing::submit_ok(engine, p, out);
  testing::drain(engine);
  EXPECT_NE(out.by_id[id].tokens, want.token_ids);
}

TEST(Engine, TopLogprobsListTheBestAlternatives) {
  testing::TinyModel m;
  Engine engine(*m.model, *m.backend, testing::small_config());
  Collector out;
  RequestParams p = testing::greedy({3, 1, 4, 1, 5, 9, 2, 6}, 5);
  p.top_logprobs = 5;
  const auto id = testing::submit_ok(engine, p, out);
  testing::drain(engine);
  const auto& got = out.by_id[id];
  ASSERT_EQ(got.top.size(), 5u);
  for (size_t i = 0; i < got.top.size(); ++i) {
    ASSERT_EQ(got.top[i].size(), 5u);
    // Greedy picks the best alternative, with the same log-prob.
    EXPECT_EQ(got.top[i][0].first, got.tokens[i]);
    EXPECT_NEAR(got.top[i][0].second, got.logprobs[i], 1e-6);
    for (size_t j = 1; j < 5; ++j) EXPECT_LE(got.top[i][j].second, got.top[i][j - 1].second);
  }
}

TEST(Engine, DecodeStepsPaddedToGraphSizesKeepGreedyTokens) {
  // Decode steps padded as a CUDA graph replay pads them (sizes 1, 2, 4, 6), run eagerly:
  // with requests arriving and finishing, batches of 3 and 5 carry padding rows, and nobody's
  // tokens or log-probs change.
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.max_running_requests = 6;
  c.testing_eager_decode_graphs = true;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  const auto requests = mixed_requests(m, 9, 4);
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    ids.push_back(testing::submit_ok(engine, requests[i], out));
    for (size_t k = 0; k < i % 3; ++k) engine.step();
  }
  testing::drain(engine);
  for (size_t i = 0; i < requests.size(); ++i)
    expect_matches_generate(m, requests[i], out.by_id[ids[i]], "request " + std::to_string(i));
  const auto s = engine.stats();
  EXPECT_GT(s.graph_steps, 0);
  EXPECT_LT(s.graph_steps, s.steps);  // prompt steps stay eager
  EXPECT_EQ(s.kv_blocks_used, 0);
}

TEST(Engine, GraphSizesAscendToTheCap) {
  EXPECT_EQ(runtime::decode_graph_sizes(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(runtime::decode_graph_sizes(6), (std::vector<int64_t>{1, 2, 4, 6}));
  EXPECT_EQ(runtime::decode_graph_sizes(16), (std::vector<int64_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(runtime::decode_graph_sizes(30), (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 30}));
  EXPECT_EQ(runtime::decode_graph_sizes(256).size(), 35u);
}

// Each layer's scratch is free again once the layer is done, so a model's step arena holds
// the largest layer's: it does not grow with the model's depth. (Both tiny models' second
// layer differs from their third: qwen3_moe's layer 1 is a dense MLP, deepseek_v3's layer 0;
// the third needs no more than the first two.)
TEST(Engine, TheStepArenaDoesNotGrowWithTheLayers) {
  auto backend = ops::make_cpu_backend(1);
  for (const char* fixture : {"qwen3_moe-tiny", "deepseek_v3-tiny"}) {
    auto arena_bytes = [&](int layers) {
      auto m = model::load_model(std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures" / fixture, *backend,
                                 {.hf_overrides = str_cat("{\"num_hidden_layers\": ", layers, "}")});
      EXPECT_EQ(m->config().n_layers, layers);
      runtime::Engine engine(*m, *backend, testing::small_config());
      return engine.stats().step_arena_bytes;
    };
    const int64_t two = arena_bytes(2);
    EXPECT_GT(two, 0) << fixture;
    EXPECT_LE(arena_bytes(3), two) << fixture;
  }
}

// What `tetra serve` takes without --chunked-prefill-size: SGLang's table by GPU memory.
TEST(Engine, DefaultPrefillChunkFollowsTheDevicesMemory) {
  class Sized final : public ops::ForwardingBackend {
   public:
    Sized(ops::Backend& in, Device d, double gib) : ForwardingBackend(in), d_(d), gib_(gib) {}
    Device device() const override { return d_; }
    ops::MemoryInfo memory_info() const override {
      return {.free_bytes = 0, .total_bytes = int64_t(gib_ * double(int64_t(1) << 30))};
    }

   private:
    Device d_;
    double gib_;
  };
  auto cpu = ops::make_cpu_backend(1);
  EXPECT_EQ(runtime::default_chunked_prefill_size(*cpu), 512);
  EXPECT_EQ(runtime::default_chunked_prefill_size(Sized(*cpu, Device::Cpu, 512)), 512);
  EXPECT_EQ(runtime::default_chunked_prefill_size(Sized(*cpu, Device::Cuda, 24)), 2048);
  EXPECT_EQ(runtime::default_chunked_prefill_size(Sized(*cpu, Device::Cuda, 48)), 4096);
  EXPECT_EQ(runtime::default_chunked_prefill_size(Sized(*cpu, Device::Cuda, 79.6)), 8192);   // H100
  EXPECT_EQ(runtime::default_chunked_prefill_size(Sized(*cpu, Device::Cuda, 139.8)), 8192);  // H200
  EXPECT_EQ(runtime::default_chunked_prefill_size(Sized(*cpu, Device::Cuda, 178)), 16384);
}

TEST(Engine, EverythingAtOnceKeepsGreedyTokens) {
  // Shared prefixes, a pool far smaller than the load, 5-token prefill chunks, a running
  // cap, grouped decode steps, staggered arrivals and a few aborts, all in one run: every
  // request that was not aborted still gets exactly generate()'s tokens.
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.kv_blocks = 20;
  c.chunked_prefill_size = 5;
  c.max_running_requests = 6;
  c.num_continuous_decode_steps = 3;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  std::mt19937 rng(21);
  const auto shared = testing::random_prompt(rng, 12, m.vocab());
  std::vector<RequestParams> requests;
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> prompt(shared.begin(), shared.begin() + (i % 3) * 6);
    const auto tail = testing::random_prompt(rng, 1 + (i * 5) % 17, m.vocab());
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    requests.push_back(testing::greedy(prompt, 1 + (i * 7) % 25));
  }
  std::vector<uint64_t> ids;
  std::set<uint64_t> aborted;
  for (size_t i = 0; i < requests.size(); ++i) {
    ids.push_back(testing::submit_ok(engine, requests[i], out));
    if (i % 7 == 3) {
      engine.abort(ids[i - 1]);
      aborted.insert(ids[i - 1]);
    }
    for (size_t k = 0; k < i % 4; ++k) engine.step();
  }
  testing::drain(engine);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& got = out.by_id[ids[i]];
    if (aborted.count(ids[i])) {
      EXPECT_EQ(got.finishes, 1);
      // A request may have finished before its abort arrived.
      EXPECT_TRUE(got.finish == FinishReason::Abort || got.finish == FinishReason::Length);
      continue;
    }
    expect_matches_generate(m, requests[i], got, "request " + std::to_string(i));
  }
  const auto s = engine.stats();
  std::printf("%lld preemptions, %lld steps, %lld prefix-hit tokens\n", (long long)s.preemptions,
              (long long)s.steps, (long long)s.prefix_cache_hit_tokens);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.running + s.waiting, 0);
}

}  // namespace
}  // namespace tetra
