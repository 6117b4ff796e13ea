// The engine as the server uses it: refusals at submit, aborts, the prefix cache, and the
// step loop on its own thread fed from other threads.
#include <gtest/gtest.h>

#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "engine_test_util.h"
#include "runtime/kv_cache.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::EngineConfig;
using runtime::FinishReason;
using runtime::RequestParams;
using runtime::SubmitError;
using testing::Collector;

TEST(EngineSubmit, RefusesInvalidRequests) {
  testing::TinyModel m;
  Engine engine(*m.model, *m.backend, testing::small_config());
  auto refused = [&](RequestParams p) {
    const auto r = engine.submit(std::move(p), {});
    EXPECT_EQ(r.error, SubmitError::Invalid);
    EXPECT_FALSE(r.message.empty());
    return r.message;
  };
  refused(testing::greedy({}, 4));
  EXPECT_NE(refused(testing::greedy({1, -1}, 4)).find("-1"), std::string::npos);
  refused(testing::greedy({1, int32_t(m.vocab())}, 4));
  refused(testing::greedy({1, 2}, 0));
  refused(testing::greedy({1, 2}, -5));
  RequestParams p = testing::greedy({1, 2}, 4);
  p.top_logprobs = 21;
  refused(p);
  p = testing::greedy({1, 2}, 4);
  p.sampling.temperature = std::nanf("");
  refused(p);
  p = testing::greedy({1, 2}, 4);
  p.sampling.top_p = 0;
  refused(p);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    p = testing::greedy({1, 2}, 4);
    p.sampling.repetition_penalty = bad;
    EXPECT_NE(refused(p).find("repetition_penalty"), std::string::npos);
  }
  EXPECT_EQ(engine.stats().waiting, 0);
}

TEST(EngineStart, ContextLongerThanTheKvCache) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.kv_blocks = 8;  // 32 tokens of KV in all
  // A context the operator chose that one sequence cannot fill: refused, naming both numbers
  // and the flag.
  c.max_context = 100;
  try {
    Engine refused(*m.model, *m.backend, c);
    ADD_FAILURE() << "started with a context of 100 tokens over 32 tokens of KV cache";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : {"--context-length 100", "32", "--kv-memory"})
      EXPECT_NE(what.find(part), std::string::npos) << what;
  }
  // The model's own context (4096) is shortened to what the cache holds.
  c.max_context = 0;
  Engine engine(*m.model, *m.backend, c);
  EXPECT_EQ(engine.config().max_context, 32);
}

// --kv-cache-dtype fp8_e4m3: a byte a value, so the same --kv-memory holds 4x the F32
// cache's blocks (the CPU's auto) and 2x a BF16 one's.
TEST(EngineStart, Fp8KvCacheHoldsMoreBlocksInTheSameMemory) {
  const std::vector<model::KvLayerShape> layout = {{.n_kv_heads = 2, .k_dim = 16, .v_dim = 16}};
  EXPECT_EQ(runtime::kv_bytes_per_block(layout, 16, DType::F8_E4M3) * 2,
            runtime::kv_bytes_per_block(layout, 16, DType::BF16));
  testing::TinyModel m32;
  auto fp8 = ops::make_cpu_backend(2, DType::F8_E4M3);
  auto m8 = model::load_model(testing::tiny_model_dir(), *fp8);
  EngineConfig c;
  c.kv_memory_bytes = int64_t(4) << 20;
  Engine e32(*m32.model, *m32.backend, c), e8(*m8, *fp8, c);
  const int64_t per_block8 = runtime::kv_bytes_per_block(m8->kv_layout(), c.block_size, DType::F8_E4M3);
  EXPECT_EQ(per_block8 * 4, runtime::kv_bytes_per_block(m8->kv_layout(), c.block_size, DType::F32));
  EXPECT_EQ(e8.stats().kv_blocks_total, c.kv_memory_bytes / per_block8);
  EXPECT_GE(e8.stats().kv_blocks_total, 4 * e32.stats().kv_blocks_total);
  // Serving works from the FP8 cache: a request runs to its length.
  testing::Collector out;
  RequestParams p;
  p.prompt = {1, 2, 3, 4, 5};
  p.max_new_tokens = 6;
  p.ignore_eos = true;
  testing::submit_ok(e8, p, out);
  testing::drain(e8);
  ASSERT_EQ(out.by_id.size(), 1u);
  EXPECT_EQ(out.by_id.begin()->second.tokens.size(), 6u);
}

TEST(EngineSubmit, RefusesRequestsThatCanNeverFit) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.kv_blocks = 8;      // 32 tokens of KV in all, so a context of 32
  Engine engine(*m.model, *m.backend, c);
  auto r = engine.submit(testing::greedy(std::vector<int32_t>(20, 1), 13), {});
  EXPECT_EQ(r.error, SubmitError::TooLong);
  EXPECT_NE(r.message.find("33"), std::string::npos) << r.message;  // 20 + 13 tokens
  r = engine.submit(testing::greedy(std::vector<int32_t>(20, 1), 12), {});
  EXPECT_EQ(r.error, SubmitError::None) << r.message;  // exactly the whole pool
  // Past the context, and a max_new_tokens so large that a sum would overflow.
  EngineConfig wide_config = testing::small_config();
  wide_config.max_context = 100;
  Engine wide(*m.model, *m.backend, wide_config);
  EXPECT_EQ(wide.submit(testing::greedy(std::vector<int32_t>(90, 1), 11), {}).error,
            SubmitError::TooLong);
  EXPECT_EQ(wide.submit(testing::greedy({1}, INT64_MAX), {}).error, SubmitError::TooLong);
  EXPECT_EQ(wide.submit(testing::greedy(std::vector<int32_t>(99, 1), 1), {}).error,
            SubmitError::None);
}

TEST(EngineSubmit, RefusesBeyondTheQueueCap) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.max_queued_requests = 3;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  for (int i = 0; i < 3; ++i) testing::submit_ok(engine, testing::greedy({1, 2, 3}, 2), out);
  const auto r = engine.submit(testing::greedy({1, 2, 3}, 2), {});
  EXPECT_EQ(r.error, SubmitError::QueueFull);
  EXPECT_FALSE(r.message.empty());
  EXPECT_EQ(engine.stats().waiting, 3);
  // Once the engine admits them the queue has room again.
  engine.step();
  testing::submit_ok(engine, testing::greedy({1, 2, 3}, 2), out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id.size(), 4u);
}

// What a client sees in the metrics once its first token arrives (RELIABILITY case 18 reads
// them so): the running request counted as running, not still as waiting, and the request
// that just arrived counted once.
TEST(EngineStats, CountEachRequestOnceWhenATokenIsDelivered) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.max_running_requests = 1;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  std::vector<runtime::EngineStats> seen;
  auto first = [&](const runtime::RequestOutput& o) {
    if (!seen.empty() || o.tokens.empty()) return;
    seen.push_back(engine.stats());
    testing::submit_ok(engine, testing::greedy({4, 5}, 2), out);
    seen.push_back(engine.stats());
  };
  ASSERT_EQ(engine.submit(testing::greedy({1, 2, 3}, 3), first).error, SubmitError::None);
  EXPECT_EQ(engine.stats().waiting, 1);
  engine.step();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].running, 1);
  EXPECT_EQ(seen[0].waiting, 0);
  EXPECT_EQ(seen[1].running, 1);
  EXPECT_EQ(seen[1].waiting, 1);
  testing::drain(engine);
  EXPECT_EQ(engine.stats().waiting, 0);
  EXPECT_EQ(engine.stats().running, 0);
}

TEST(EngineSubmit, ShuttingDownRefuses) {
  testing::TinyModel m;
  Engine engine(*m.model, *m.backend, testing::small_config());
  engine.stop_accepting();
  EXPECT_EQ(engine.submit(testing::greedy({1}, 1), {}).error, SubmitError::ShuttingDown);
}

TEST(EngineAbort, FreesEveryBlockBeforeTheNextStep) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.chunked_prefill_size = 8;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  std::mt19937 rng(7);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i)
    ids.push_back(testing::submit_ok(engine, testing::greedy(testing::random_prompt(rng, 13, m.vocab()), 50), out));
  for (int i = 0; i < 5; ++i) engine.step();
  const auto busy = engine.stats();
  EXPECT_GT(busy.kv_blocks_used, 0);
  EXPECT_GT(busy.running, 0);
  EXPECT_GT(busy.waiting, 0);  // some still queued behind the 8-token prefill budget
  for (uint64_t id : ids) engine.abort(id);
  engine.abort(999999);  // unknown ids are ignored
  EXPECT_TRUE(engine.step());
  const auto idle = engine.stats();
  EXPECT_EQ(idle.kv_blocks_used, 0);
  EXPECT_EQ(idle.kv_blocks_free, idle.kv_blocks_total);
  EXPECT_EQ(idle.running, 0);
  EXPECT_EQ(idle.waiting, 0);
  for (uint64_t id : ids) {
    EXPECT_EQ(out.by_id[id].finish, FinishReason::Abort) << id;
    EXPECT_EQ(out.by_id[id].finishes, 1) << id;
  }
  EXPECT_FALSE(engine.step());
}

TEST(EngineAbort, AbortAllEndsQueuedAndRunning) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.max_running_requests = 2;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  for (int i = 0; i < 5; ++i) testing::submit_ok(engine, testing::greedy({4, 5, 6}, 30), out);
  engine.step();
  engine.abort_all();
  engine.step();
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  ASSERT_EQ(out.by_id.size(), 5u);
  for (auto& [id, got] : out.by_id) EXPECT_EQ(got.finish, FinishReason::Abort);
}

TEST(EnginePrefixCache, SharedPrefixHitsAndGivesTheSameTokens) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  std::mt19937 rng(11);
  const auto prefix = testing::random_prompt(rng, 18, m.vocab());
  auto first = testing::greedy(prefix, 6);
  first.prompt.push_back(1);
  auto second = testing::greedy(prefix, 6);
  second.prompt.push_back(2);
  second.prompt.push_back(3);
  const auto id1 = testing::submit_ok(engine, first, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[id1].cached_prompt_tokens, 0);
  const auto id2 = testing::submit_ok(engine, second, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[id2].cached_prompt_tokens, 16);  // 4 full blocks of the 18 shared tokens
  EXPECT_EQ(out.by_id[id2].tokens, testing::reference(m, second).token_ids);
  const auto s = engine.stats();
  EXPECT_EQ(s.prefix_cache_hit_tokens, 16);
  EXPECT_EQ(s.prefix_cache_queried_tokens, 19 + 20);
  EXPECT_GT(s.kv_blocks_cached, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);  // cached blocks are free to evict

  // The same prompt again: every full block but the one holding the last token is a hit.
  const auto id3 = testing::submit_ok(engine, second, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[id3].cached_prompt_tokens, 16);
  EXPECT_EQ(out.by_id[id3].tokens, out.by_id[id2].tokens);
}

TEST(EnginePrefixCache, RequestsArrivingTogetherShareAPromptBeingComputed) {
  // Four choices of one prompt (the server's n = 4) and one request sharing only its first
  // half, all submitted before the first step: the first computes the prompt, the others
  // wait a step and take its blocks from the cache.
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.chunked_prefill_size = 16;  // the shared prompt takes 3 steps to compute
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  std::mt19937 rng(13);
  const auto prompt = testing::random_prompt(rng, 41, m.vocab());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    RequestParams p = testing::greedy(prompt, 5);
    p.sampling.temperature = 0.7f;
    p.seed = uint64_t(i);
    ids.push_back(testing::submit_ok(engine, p, out));
  }
  auto half = testing::greedy(std::vector<int32_t>(prompt.begin(), prompt.begin() + 20), 5);
  half.prompt.push_back(3);
  const auto half_id = testing::submit_ok(engine, half, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[ids[0]].cached_prompt_tokens, 0);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(out.by_id[ids[size_t(i)]].cached_prompt_tokens, 40) << i;
  EXPECT_EQ(out.by_id[half_id].cached_prompt_tokens, 20);
  EXPECT_EQ(out.by_id[half_id].tokens, testing::reference(m, half).token_ids);
  for (int i = 0; i < 4; ++i) {
    RequestParams p = testing::greedy(prompt, 5);
    p.sampling.temperature = 0.7f;
    p.seed = uint64_t(i);
    EXPECT_EQ(out.by_id[ids[size_t(i)]].tokens, testing::reference(m, p).token_ids) << i;
  }
  EXPECT_EQ(engine.stats().prefix_cache_hit_tokens, 3 * 40 + 20);
}

TEST(EnginePrefixCache, ForcedHashCollisionsServeNoWrongBlocks) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.testing_constant_block_hash = true;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  std::mt19937 rng(12);
  std::vector<RequestParams> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(testing::greedy(testing::random_prompt(rng, 17, m.vocab()), 5));
  std::vector<uint64_t> ids;
  for (const auto& p : requests) {
    ids.push_back(testing::submit_ok(engine, p, out));
    testing::drain(engine);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(out.by_id[ids[i]].cached_prompt_tokens, 0) << i;
    EXPECT_EQ(out.by_id[ids[i]].tokens, testing::reference(m, requests[i]).token_ids) << i;
  }
  EXPECT_EQ(engine.stats().prefix_cache_hit_tokens, 0);
}

TEST(EnginePrefixCache, DisabledMeansNoHits) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.enable_prefix_caching = false;
  Engine engine(*m.model, *m.backend, c);
  Collector out;
  const auto p = testing::greedy(std::vector<int32_t>(40, 9), 3);
  testing::submit_ok(engine, p, out);
  testing::drain(engine);
  const auto id = testing::submit_ok(engine, p, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[id].cached_prompt_tokens, 0);
  EXPECT_EQ(engine.stats().kv_blocks_cached, 0);
}

// The server's view: run() on its own thread, submits from several threads, completion
// awaited on a condition variable, then stop().
TEST(EngineThread, RunServesSubmitsFromOtherThreads) {
  testing::TinyModel m;
  Engine engine(*m.model, *m.backend, testing::small_config());
  std::thread loop([&] { engine.run(); });

  std::mutex mu;
  std::condition_variable done_cv;
  Collector out;
  int done = 0;
  const int n_threads = 4, per_thread = 3;
  std::vector<std::vector<RequestParams>> params(n_threads);
  std::vector<std::vector<uint64_t>> ids(n_threads);
  for (int t = 0; t < n_threads; ++t) {
    std::mt19937 rng(100 + t);
    for (int i = 0; i < per_thread; ++i)
      params[size_t(t)].push_back(testing::greedy(testing::random_prompt(rng, 5 + 3 * i, m.vocab()), 6));
  }
  auto callback = [&](const runtime::RequestOutput& o) {
    std::lock_guard<std::mutex> lock(mu);
    out.callback()(o);
    if (o.finish != FinishReason::None) {
      ++done;
      done_cv.notify_all();
    }
  };
  std::vector<std::thread> clients;
  for (int t = 0; t < n_threads; ++t)
    clients.emplace_back([&, t] {
      for (const auto& p : params[size_t(t)]) {
        const auto r = engine.submit(p, callback);
        std::lock_guard<std::mutex> lock(mu);
        ids[size_t(t)].push_back(r.request_id);
      }
    });
  for (auto& c : clients) c.join();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(done_cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == n_threads * per_thread; }));
  }
  engine.stop();
  loop.join();
  for (int t = 0; t < n_threads; ++t)
    for (int i = 0; i < per_thread; ++i)
      EXPECT_EQ(out.by_id[ids[size_t(t)][size_t(i)]].tokens,
                testing::reference(m, params[size_t(t)][size_t(i)]).token_ids);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST(EngineThread, ClientsAbortingMidStreamLeakNothing) {
  // Four client threads, five requests each; every other request is aborted by its client
  // once two tokens have arrived. The rest finish with generate()'s tokens, and the pool,
  // the queue and the running set are empty afterwards.
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.block_size = 4;
  c.kv_blocks = 40;
  c.max_running_requests = 8;
  Engine engine(*m.model, *m.backend, c);
  std::thread loop([&] { engine.run(); });

  struct Tracked {
    RequestParams params;
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::None;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Tracked> tracked;
  auto callback = [&](const runtime::RequestOutput& o) {
    std::lock_guard<std::mutex> lock(mu);
    Tracked& t = tracked[o.request_id];
    for (const auto& tok : o.tokens) t.tokens.push_back(tok.token);
    if (o.finish != FinishReason::None) t.finish = o.finish;
    cv.notify_all();
  };
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      std::mt19937 rng(200 + t);
      for (int i = 0; i < 5; ++i) {
        RequestParams p = testing::greedy(testing::random_prompt(rng, 4 + 2 * i, m.vocab()), 12);
        std::unique_lock<std::mutex> lock(mu);
        const auto r = engine.submit(p, callback);
        ASSERT_EQ(r.error, SubmitError::None);
        tracked[r.request_id].params = p;
        if (i % 2 == 1) {
          cv.wait(lock, [&] {
            const Tracked& tr = tracked[r.request_id];
            return tr.tokens.size() >= 2 || tr.finish != FinishReason::None;
          });
          lock.unlock();
          engine.abort(r.request_id);
        }
      }
    });
  for (auto& cl : clients) cl.join();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] {
      for (const auto& [id, t] : tracked)
        if (t.finish == FinishReason::None) return false;
      return true;
    }));
  }
  engine.stop();
  loop.join();
  int aborted = 0;
  for (const auto& [id, t] : tracked) {
    if (t.finish == FinishReason::Abort) {
      ++aborted;
      EXPECT_GE(t.tokens.size(), 2u);
      continue;
    }
    EXPECT_EQ(t.tokens, testing::reference(m, t.params).token_ids) << id;
  }
  EXPECT_GT(aborted, 0);
  const auto s = engine.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
}

TEST(EngineThread, StopAbortsWhatIsLeft) {
  testing::TinyModel m;
  EngineConfig c = testing::small_config();
  c.max_running_requests = 1;
  Engine engine(*m.model, *m.backend, c);
  std::mutex mu;
  std::condition_variable cv;
  int tokens = 0;
  std::vector<FinishReason> finishes;
  auto callback = [&](const runtime::RequestOutput& o) {
    std::lock_guard<std::mutex> lock(mu);
    tokens += int(o.tokens.size());
    if (o.finish != FinishReason::None) finishes.push_back(o.finish);
    cv.notify_all();
  };
  std::thread loop([&] { engine.run(); });
  for (int i = 0; i < 3; ++i) engine.submit(testing::greedy({1, 2, 3}, 400), callback);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return tokens >= 2; });
  }
  engine.stop();
  loop.join();
  ASSERT_EQ(finishes.size(), 3u);
  for (auto f : finishes) EXPECT_EQ(f, FinishReason::Abort);
  EXPECT_EQ(engine.submit(testing::greedy({1}, 1), {}).error, SubmitError::ShuttingDown);
}

// The real model, except that a forward can be made to fail as a device fault would.
class FaultyModel : public model::Model {
 public:
  explicit FaultyModel(model::Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::vector<model::KvLayerShape> kv_layout() const override { return inner_.kv_layout(); }
  model::LoadStats load_stats() const override { return inner_.load_stats(); }
  std::vector<const ops::MoeExperts*> moe_experts() const override { return inner_.moe_experts(); }
  void forward(const ops::Context& ctx, const model::StepInputs& in, const std::vector<ops::KvCacheLayer>& cache,
               TensorView logits) override {
    if (fail_next) {
      fail_next = false;
      fail("injected device fault");
    }
    inner_.forward(ctx, in, cache, logits);
  }
  bool fail_next = false;

 private:
  model::Model& inner_;
};

TEST(EngineFault, FailedStepEndsItsRequestsWithAnErrorAndServingGoesOn) {
  testing::TinyModel m;
  FaultyModel faulty(*m.model);
  Engine engine(faulty, *m.backend, testing::small_config());
  Collector out;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(testing::submit_ok(engine, testing::greedy({1, 2, 3, 4, 5}, 20), out));
  engine.step();
  faulty.fail_next = true;
  engine.step();
  for (uint64_t id : ids) {
    EXPECT_EQ(out.by_id[id].finish, FinishReason::Error);
    EXPECT_EQ(out.by_id[id].finishes, 1);
  }
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_EQ(engine.stats().failed_steps, 1);
  const auto p = testing::greedy({9, 8, 7}, 6);
  const auto id = testing::submit_ok(engine, p, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[id].tokens, testing::reference(m, p).token_ids);
}

TEST(EngineFault, ThrowingCallbackDoesNotStopTheEngine) {
  testing::TinyModel m;
  Engine engine(*m.model, *m.backend, testing::small_config());
  engine.submit(testing::greedy({1, 2}, 3), [](const runtime::RequestOutput&) { fail("callback bug"); });
  Collector out;
  const auto p = testing::greedy({3, 4}, 3);
  const auto id = testing::submit_ok(engine, p, out);
  testing::drain(engine);
  EXPECT_EQ(out.by_id[id].tokens, testing::reference(m, p).token_ids);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace tetra
