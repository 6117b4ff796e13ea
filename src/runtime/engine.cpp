#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "core/log.h"
#include "runtime/block_manager.h"
#include "runtime/kv_cache.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"
#include "runtime/step_builder.h"

namespace tetra::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
  }
  return "";
}

namespace {

constexpr int kMaxTopLogprobs = 20;

int64_t pool_blocks(const model::Model& model, const ops::Backend& backend, const EngineConfig& c) {
  if (c.kv_blocks > 0) return c.kv_blocks;
  const int64_t per_block =
      kv_bytes_per_block(model.kv_layout(), c.block_size, backend.activation_dtype());
  const int64_t n = per_block > 0 ? c.kv_memory_bytes / per_block : 0;
  TETRA_CHECK(n > 0, "kv_memory_bytes (", c.kv_memory_bytes, ") is less than one KV block of ",
              per_block, " bytes");
  return n;
}

void check_config(const EngineConfig& c, const ModelConfig& m) {
  TETRA_CHECK(c.block_size > 0 && c.block_size <= 1024, "block_size must be in [1, 1024], not ",
              c.block_size);
  TETRA_CHECK(c.max_running_requests >= 1, "max_running_requests must be at least 1");
  TETRA_CHECK(c.max_queued_requests >= 0, "max_queued_requests cannot be negative");
  TETRA_CHECK(c.chunked_prefill_size >= 1, "chunked_prefill_size must be at least 1");
  TETRA_CHECK(c.num_continuous_decode_steps >= 1, "num_continuous_decode_steps must be at least 1");
  TETRA_CHECK(c.max_context >= 0 && c.max_context <= m.max_position_embeddings, "max_context (",
              c.max_context, ") must be at most the model's context of ",
              m.max_position_embeddings, " (0 means the model's)");
}

// The n most likely tokens of a row of logits with their natural-log probabilities.
std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, int n) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - m);
  const double lse = m + std::log(sum);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  n = std::min<int>(n, int(ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(ids[size_t(i)], float(logits[size_t(ids[size_t(i)])] - lse));
  return out;
}

RequestOutput output_of(const Request& r) {
  RequestOutput out;
  out.request_id = r.id;
  out.prompt_tokens = r.prompt_len;
  out.cached_prompt_tokens = r.cached_prompt_tokens;
  out.completion_tokens = r.n_generated();
  return out;
}

// A callback that throws is the caller's bug; it must not take the engine loop down.
void deliver(const Request& r, const RequestOutput& out) {
  if (!r.on_output) return;
  try {
    r.on_output(out);
  } catch (const std::exception& e) {
    log_warn("output callback of request ", r.id, " threw: ", e.what());
  }
}

}  // namespace

struct Engine::Impl {
  Impl(model::Model& m, ops::Backend& b, EngineConfig c)
      : model(m), backend(b), config(std::move(c)), vocab(m.config().vocab_size),
        n_blocks((check_config(config, m.config()), pool_blocks(m, b, config))),
        cache(b, m.kv_layout(), config.block_size, n_blocks),
        blocks(n_blocks, config.block_size, config.enable_prefix_caching),
        scheduler({config.max_running_requests, config.chunked_prefill_size}, blocks),
        builder(b, config.block_size) {
    if (config.max_context == 0) config.max_context = m.config().max_position_embeddings;
    if (config.testing_constant_block_hash)
      blocks.set_hash_for_testing([](uint64_t, std::span<const int32_t>) { return uint64_t(42); });
    const int64_t block_bytes =
        kv_bytes_per_block(m.kv_layout(), config.block_size, b.activation_dtype());
    log_info("KV cache: ", n_blocks, " blocks of ", config.block_size, " tokens (",
             std::round(double(n_blocks * block_bytes) / (1 << 20) * 10) / 10, " MiB), context ",
             config.max_context,
             ", prefix caching ", config.enable_prefix_caching ? "on" : "off");
    publish_stats();
  }

  // ---- shared with server threads (under mu) ----
  SubmitResult validate(const RequestParams& p) const;
  void publish_stats();

  // ---- engine thread ----
  bool take_inbox();
  void run_chunks(const std::vector<ScheduledChunk>& chunks);
  void post_process(const ScheduledChunk& c, std::span<const float> logits);
  void finish(Request* r, FinishReason reason, const std::string& error = {});

  model::Model& model;
  ops::Backend& backend;
  EngineConfig config;
  const int64_t vocab;
  const int64_t n_blocks;
  KvCache cache;
  BlockManager blocks;
  Scheduler scheduler;
  StepBuilder builder;
  std::unique_ptr<ops::Buffer> logits_buf;
  int64_t logits_capacity = 0;
  std::vector<float> logits_host;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests;
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0, failed_steps = 0;

  mutable std::mutex mu;
  std::condition_variable wake;
  std::vector<std::unique_ptr<Request>> inbox;
  std::vector<uint64_t> aborts;
  bool abort_everything = false;
  bool accepting = true;
  bool stopping = false;
  uint64_t next_id = 1;
  // As of the last publish, except that `waiting` counts only the scheduler's queue and is
  // kept current as arrivals leave the inbox; readers add inbox.size() under `mu`.
  EngineStats snapshot;
};

SubmitResult Engine::Impl::validate(const RequestParams& p) const {
  auto invalid = [](std::string m) { return SubmitResult{0, SubmitError::Invalid, std::move(m)}; };
  if (p.prompt.empty()) return invalid("The prompt has no tokens.");
  for (int32_t id : p.prompt)
    if (id < 0 || id >= vocab)
      return invalid(str_cat("Prompt token id ", id, " is outside the vocabulary [0, ", vocab, ")."));
  if (p.max_new_tokens < 1)
    return invalid(str_cat("max_new_tokens must be at least 1, not ", p.max_new_tokens, "."));
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs)
    return invalid(str_cat("top_logprobs must be between 0 and ", kMaxTopLogprobs, ", not ",
                           p.top_logprobs, "."));
  const SamplingParams& s = p.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return invalid("temperature must be a finite number of at least 0.");
  if (!(s.top_p > 0 && s.top_p <= 1)) return invalid("top_p must be in (0, 1].");
  if (s.top_k < 0) return invalid("top_k cannot be negative.");
  if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty))
    return invalid("presence_penalty and frequency_penalty must be finite numbers.");

  const int64_t n_prompt = int64_t(p.prompt.size()), context = config.max_context;
  if (p.max_new_tokens > context || n_prompt + p.max_new_tokens > context)
    return {0, SubmitError::TooLong,
            str_cat("The prompt (", n_prompt, " tokens) plus max_new_tokens (", p.max_new_tokens,
                    ") exceeds the context of ", context, " tokens.")};
  const int64_t need = blocks.blocks_for(n_prompt + p.max_new_tokens);
  if (need > n_blocks)
    return {0, SubmitError::TooLong,
            str_cat("The prompt (", n_prompt, " tokens) plus max_new_tokens (", p.max_new_tokens,
                    ") is ", n_prompt + p.max_new_tokens, " tokens, more than the KV cache's ",
                    n_blocks * config.block_size, " tokens.")};
  return {};
}

void Engine::Impl::publish_stats() {
  EngineStats s;
  s.running = scheduler.n_running();
  s.waiting = scheduler.n_waiting();
  s.kv_blocks_total = blocks.n_total();
  s.kv_blocks_free = blocks.n_free();
  s.kv_blocks_used = s.kv_blocks_total - s.kv_blocks_free;
  s.kv_blocks_cached = blocks.n_cached();
  s.prefix_cache_hit_tokens = scheduler.stats().prefix_hit_tokens;
  s.prefix_cache_queried_tokens = scheduler.stats().prefix_queried_tokens;
  s.preemptions = scheduler.stats().preemptions;
  s.prompt_tokens = prompt_tokens;
  s.generated_tokens = generated_tokens;
  s.steps = steps;
  s.failed_steps = failed_steps;
  std::lock_guard<std::mutex> lock(mu);
  snapshot = s;
}

// Moves new requests into the scheduler and carries out aborts. True when there was any.
bool Engine::Impl::take_inbox() {
  std::vector<std::unique_ptr<Request>> arrived;
  std::vector<uint64_t> to_abort;
  bool all = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    arrived.swap(inbox);
    to_abort.swap(aborts);
    all = abort_everything;
    abort_everything = false;
    snapshot.waiting += int64_t(arrived.size());  // still waiting, now in the scheduler
  }
  for (auto& r : arrived) {
    Request* raw = r.get();
    prompt_tokens += raw->prompt_len;
    requests.emplace(raw->id, std::move(r));
    scheduler.add(raw);
  }
  if (all) {
    std::vector<Request*> everyone;
    for (auto& [id, r] : requests) everyone.push_back(r.get());
    std::sort(everyone.begin(), everyone.end(),
              [](const Request* a, const Request* b) { return a->arrival < b->arrival; });
    for (Request* r : everyone) finish(r, FinishReason::Abort);
  }
  for (uint64_t id : to_abort)
    if (auto it = requests.find(id); it != requests.end()) finish(it->second.get(), FinishReason::Abort);
  return !arrived.empty() || !to_abort.empty() || all;
}

void Engine::Impl::finish(Request* r, FinishReason reason, const std::string& error) {
  scheduler.remove(r);
  r->state = RequestState::Finished;
  RequestOutput out = output_of(*r);
  out.finish = reason;
  out.error = error;
  deliver(*r, out);
  requests.erase(r->id);
}

void Engine::Impl::run_chunks(const std::vector<ScheduledChunk>& chunks) {
  std::vector<SeqChunk> seq_chunks;
  int64_t n_rows = 0;
  for (const auto& c : chunks) {
    Request* r = c.request;
    seq_chunks.push_back({.tokens = std::span<const int32_t>(r->tokens).subspan(size_t(r->n_computed),
                                                                                size_t(c.n_tokens)),
                          .start_position = r->n_computed,
                          .blocks = r->table.blocks,
                          .want_logits = c.want_logits});
    n_rows += c.want_logits ? 1 : 0;
  }
  if (!logits_buf || n_rows > logits_capacity) {
    logits_capacity = std::max<int64_t>({1, n_rows, 2 * logits_capacity});
    logits_buf = backend.alloc(DType::F32, {logits_capacity, vocab});
  }
  // A step of prompt chunks that all end mid-prompt wants no logits: zero rows.
  const TensorView logits = logits_buf->view().rows(0, n_rows);
  try {
    if (config.testing_fail_step == steps + failed_steps)
      fail("injected fault at step ", config.testing_fail_step, " (TETRA_TESTING_FAIL_STEP)");
    model.forward(builder.build(seq_chunks), cache.layers(), logits);
    logits_host.resize(size_t(n_rows * vocab));
    if (n_rows > 0) backend.copy_to_host(logits_host.data(), logits);
  } catch (const std::exception& e) {
    // The batch's requests cannot continue; the others keep their state and run next step.
    log_warn("engine step failed: ", e.what());
    ++failed_steps;
    publish_stats();  // health reports the failure before any client hears of it
    for (const auto& c : chunks) finish(c.request, FinishReason::Error, e.what());
    return;
  }
  ++steps;
  int64_t row = 0;
  for (const auto& c : chunks) {
    std::span<const float> l;
    if (c.want_logits) l = std::span<const float>(logits_host).subspan(size_t(row++ * vocab), size_t(vocab));
    post_process(c, l);
  }
}

void Engine::Impl::post_process(const ScheduledChunk& c, std::span<const float> logits) {
  Request* r = c.request;
  r->n_computed += c.n_tokens;
  // Only the client's prompt is cached: generated tokens are specific to one request.
  const int64_t cacheable = std::min(r->n_computed, r->prompt_len);
  blocks.register_blocks(std::span<const int32_t>(r->tokens).first(size_t(cacheable)), r->table);
  if (!c.want_logits) return;

  const RequestParams& p = r->params;
  const bool penalties = p.sampling.presence_penalty != 0 || p.sampling.frequency_penalty != 0;
  if (penalties && r->counts.empty()) {
    r->counts.assign(size_t(vocab), 0);
    for (int64_t i = r->prompt_len; i < r->n_tokens(); ++i) ++r->counts[size_t(r->tokens[size_t(i)])];
  }
  const Sample s = r->sampler.sample(logits, p.sampling, r->counts);
  TokenOutput t;
  t.token = s.token;
  t.logprob = s.logprob;
  if (p.top_logprobs > 0) t.top_logprobs = top_logprobs(logits, p.top_logprobs);
  r->tokens.push_back(s.token);
  if (!r->counts.empty()) ++r->counts[size_t(s.token)];
  ++generated_tokens;

  FinishReason reason = FinishReason::None;
  const auto& eos = model.config().eos_token_ids;
  if (!p.ignore_eos && std::find(eos.begin(), eos.end(), s.token) != eos.end())
    reason = FinishReason::Stop;
  else if (r->n_generated() >= p.max_new_tokens)
    reason = FinishReason::Length;

  RequestOutput out = output_of(*r);
  out.finish = reason;
  out.tokens.push_back(std::move(t));
  deliver(*r, out);
  if (reason != FinishReason::None) {
    scheduler.remove(r);
    requests.erase(r->id);
  }
}

Engine::Engine(model::Model& model, ops::Backend& backend, EngineConfig config)
    : impl_(std::make_unique<Impl>(model, backend, std::move(config))) {}

Engine::~Engine() = default;

const EngineConfig& Engine::config() const { return impl_->config; }

SubmitResult Engine::submit(RequestParams params, OutputCallback on_output) {
  Impl& s = *impl_;
  SubmitResult check = s.validate(params);
  if (check.error != SubmitError::None) return check;
  auto request = std::make_unique<Request>(0, 0, std::move(params), std::move(on_output));
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.accepting || s.stopping)
    return {0, SubmitError::ShuttingDown, "The server is shutting down and accepts no new requests."};
  if (s.snapshot.waiting + int64_t(s.inbox.size()) >= s.config.max_queued_requests)
    return {0, SubmitError::QueueFull,
            str_cat("The request queue is full (", s.config.max_queued_requests,
                    " waiting); retry later.")};
  request->id = request->arrival = s.next_id++;
  const uint64_t id = request->id;
  s.inbox.push_back(std::move(request));
  s.wake.notify_one();
  return {id, SubmitError::None, {}};
}

void Engine::abort(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->aborts.push_back(request_id);
  impl_->wake.notify_one();
}

void Engine::abort_all() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->abort_everything = true;
  impl_->wake.notify_one();
}

void Engine::stop_accepting() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->accepting = false;
}

void Engine::stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stopping = true;
  impl_->wake.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EngineStats s = impl_->snapshot;
  s.waiting += int64_t(impl_->inbox.size());
  return s;
}

bool Engine::step() {
  Impl& s = *impl_;
  bool did = s.take_inbox();
  auto chunks = s.scheduler.schedule();
  // Admissions and preemptions show before any client hears of this step's tokens.
  s.publish_stats();
  if (!chunks.empty()) {
    did = true;
    s.run_chunks(chunks);
    // Pure decode batches may run several steps in a row without looking at the queue;
    // aborts still end a request before the next forward.
    for (int k = 1; k < s.config.num_continuous_decode_steps; ++k) {
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (!s.aborts.empty() || s.abort_everything || s.stopping) break;
      }
      chunks = s.scheduler.schedule_decodes();
      if (chunks.empty()) break;
      s.run_chunks(chunks);
    }
  }
  s.publish_stats();
  return did;
}

void Engine::run() {
  Impl& s = *impl_;
  bool idle = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.wake.wait(lock, [&] {
        return s.stopping || !s.inbox.empty() || !s.aborts.empty() || s.abort_everything ||
               (!idle && s.scheduler.has_work());
      });
      if (s.stopping) break;
    }
    idle = !step();
  }
  // Nobody will step again: finish what is left so no client waits forever.
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.abort_everything = true;
  }
  s.take_inbox();
  s.publish_stats();
}

}  // namespace tetra::runtime
