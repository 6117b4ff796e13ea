#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "core/log.h"
#include "runtime/block_manager.h"
#include "runtime/decode_graphs.h"
#include "runtime/kv_cache.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"
#include "runtime/sampler.h"
#include "runtime/step_builder.h"
#include "runtime/step_order.h"

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

void check_config(const EngineConfig& c, const ModelConfig& m) {
  // Messages name the `tetra serve` flags that set these fields.
  TETRA_CHECK(c.block_size > 0 && c.block_size <= 1024, "the KV block size must be in [1, 1024], not ",
              c.block_size);
  TETRA_CHECK(c.max_running_requests >= 1, "--max-running-requests must be at least 1");
  TETRA_CHECK(c.max_queued_requests >= 0, "--max-queued-requests cannot be negative");
  TETRA_CHECK(c.chunked_prefill_size >= 1, "--chunked-prefill-size must be at least 1");
  TETRA_CHECK(c.num_continuous_decode_steps >= 1, "--num-continuous-decode-steps must be at least 1");
  TETRA_CHECK(c.mem_fraction_static > 0 && c.mem_fraction_static <= 1,
              "--mem-fraction-static must be in (0, 1], not ", c.mem_fraction_static);
  TETRA_CHECK(!(c.bench_skip_prompt_forward && c.enable_prefix_caching),
              "skipping the prompts' forward needs the prefix cache off: their random blocks are no prefix");
  TETRA_CHECK(c.cuda_graph_max_bs >= 1, "--cuda-graph-max-bs must be at least 1, not ", c.cuda_graph_max_bs);
  TETRA_CHECK(c.max_context >= 0 && c.max_context <= m.max_position_embeddings, "--context-length ",
              c.max_context, " is more than the model's context of ", m.max_position_embeddings,
              " tokens (max_position_embeddings)");
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

// One token of every sequence, each wanting its next token: what a decode graph runs.
bool decode_only(const std::vector<ScheduledChunk>& chunks) {
  return std::all_of(chunks.begin(), chunks.end(),
                     [](const ScheduledChunk& c) { return c.n_tokens == 1 && c.want_logits; });
}

}  // namespace

struct Engine::Impl {
  Impl(std::unique_ptr<ModelRanks> own, ModelRanks& r, EngineConfig c)
      : own_ranks(std::move(own)), ranks(r), model(r.model()), backend(r.backend()), config(std::move(c)),
        vocab(model.config().vocab_size),
        max_context((check_config(config, model.config()),
                     config.max_context ? config.max_context : model.config().max_position_embeddings)),
        capacity{.max_tokens = config.chunked_prefill_size + config.max_running_requests,
                 .max_seqs = config.max_running_requests,
                 .max_blocks_per_seq = (max_context + config.block_size - 1) / config.block_size},
        rank_steps(r, config.block_size, capacity), arena(rank_steps.arena()), ctx(rank_steps.context()),
        builder(rank_steps.builder()), sampler(backend, capacity.max_seqs),
        logits_buf(backend.alloc(DType::F32, {capacity.max_seqs, vocab})),
        n_blocks(prepare()),
        cache(r, config.block_size, n_blocks,
              config.bench_skip_prompt_forward ? std::optional<uint64_t>(0x6b76) : std::nullopt),
        blocks(n_blocks, config.block_size, config.enable_prefix_caching),
        scheduler({.max_running_requests = config.max_running_requests,
                   .chunked_prefill_size = config.chunked_prefill_size,
                   .skip_prompt_forward = config.bench_skip_prompt_forward},
                  blocks) {
    fit_context_to_kv_cache();
    config.max_context = max_context;
    capture_decode_graphs();
    if (config.testing_constant_block_hash)
      blocks.set_hash_for_testing([](uint64_t, std::span<const int32_t>) { return uint64_t(42); });
    const int64_t block_bytes = kv_bytes_per_block(model.kv_layout(), config.block_size, backend.kv_dtype());
    log_info("KV cache: ", n_blocks, " blocks of ", config.block_size, " tokens (",
             std::round(double(n_blocks * block_bytes) / (1 << 20) * 10) / 10, " MiB, ",
             dtype_name(backend.kv_dtype()), ranks.world() > 1 ? str_cat(", each of ", ranks.world(), " ranks") : "",
             "), context ", config.max_context, ", prefix caching ",
             config.enable_prefix_caching ? "on" : "off", "; step arena ",
             std::round(double(arena.capacity_bytes()) / (1 << 20) * 10) / 10, " MiB");
    publish_stats();
  }

  // Before serving: the backend's warm-up, then a measuring pass at the largest step (which
  // sizes and freezes the arena), then the KV pool from what memory is left.
  int64_t prepare();
  void measure_step(int64_t n_seqs, int64_t n_tokens, bool long_context);
  int64_t kv_pool_blocks() const;
  int64_t kv_blocks_affordable(const model::Model& m, const ops::Backend& b) const;
  std::vector<int64_t> graph_sizes() const;
  void capture_decode_graphs();
  void fit_context_to_kv_cache();

  // ---- shared with server threads (under mu) ----
  SubmitResult validate(const RequestParams& p) const;
  void publish_stats();

  // ---- engine thread ----
  bool take_inbox();
  void run_chunks(const std::vector<ScheduledChunk>& chunks);
  // One rank's part of a step, on its thread: a decode graph's replay or a forward.
  void run_rank(int r, const std::vector<SeqChunk>& chunks, TensorView logits, bool from_graph, int fail_rank);
  void follow();  // Engine::follow
  void post_process(const ScheduledChunk& c, const ops::SampledToken* sampled);
  void finish(Request* r, FinishReason reason, const std::string& error = {});

  std::unique_ptr<ModelRanks> own_ranks;  // the one rank made of a plain model and backend
  ModelRanks& ranks;
  model::Model& model;     // rank 0's: the config, the KV layout, the logits sampled
  ops::Backend& backend;
  EngineConfig config;
  const int64_t vocab;
  int64_t max_context;  // shortened once at start when the KV cache cannot hold the model's
  const StepCapacity capacity;
  RankSteps rank_steps;    // every rank's arena, step builder and context
  ops::Arena& arena;       // rank 0's
  const ops::Context& ctx;
  StepBuilder& builder;
  BatchSampler sampler;
  std::unique_ptr<ops::Buffer> logits_buf;  // F32 [max_seqs, vocab]
  const int64_t n_blocks;
  RankCaches cache;        // every rank's, one block numbering
  BlockManager blocks;
  Scheduler scheduler;
  std::vector<std::unique_ptr<DecodeGraphs>> graphs;  // one a rank; empty: every step eager
  std::vector<SampleRequest> sample_rows;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests;
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0, graph_steps = 0, failed_steps = 0;

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

int64_t Engine::Impl::prepare() {
  const ModelConfig& mc = model.config();
  ranks.run([&](int r) {
    ranks.backend(r).warm_up(rank_steps.context(r), ranks.model(r).moe_experts(), int(mc.n_experts_per_tok),
                             capacity.max_tokens);
  });
  // The largest steps: the most tokens (one long prompt chunk beside single-token sequences),
  // the same tokens as one sequence at the longest context (a long prompt's last chunks:
  // prefill attention splits its keys into scratch when few sequences leave SMs idle, and one
  // sequence splits them most), and the most sequences deciding at the longest context.
  const int64_t seqs = std::min(capacity.max_seqs, capacity.max_tokens);
  measure_step(seqs, capacity.max_tokens, false);
  measure_step(1, capacity.max_tokens, true);
  measure_step(capacity.max_seqs, capacity.max_seqs, true);
  // Each decode graph's step as it will be captured (attention planned for the whole
  // context; a smaller batch may split its keys more than the largest).
  for (int64_t b : graph_sizes()) measure_step(b, b, true);
  rank_steps.freeze();
  return kv_pool_blocks();
}

void Engine::Impl::measure_step(int64_t n_seqs, int64_t n_tokens, bool long_context) {
  const int bs = config.block_size;
  // Sequence lengths: the first as long as a sequence may be, the rest sharing what is left
  // (each at least one token, none past the context).
  n_tokens = std::min(n_tokens, n_seqs * max_context);
  std::vector<int64_t> lengths(static_cast<size_t>(n_seqs), 1);
  int64_t left = n_tokens - n_seqs;
  for (auto& len : lengths) {
    const int64_t more = std::min(left, max_context - 1);
    len += more;
    left -= more;
  }
  const int64_t longest = lengths[0];
  const int64_t n_cache_blocks = (longest + bs - 1) / bs;
  RankCaches scratch(ranks, bs, n_cache_blocks);  // zeroed
  std::vector<int32_t> table(static_cast<size_t>(n_cache_blocks));
  for (int64_t b = 0; b < n_cache_blocks; ++b) table[size_t(b)] = int32_t(b);
  const std::vector<int32_t> tokens(static_cast<size_t>(longest), 0);
  // Every sequence uses the first blocks of one scratch cache: their writes collide harmlessly.
  std::vector<SeqChunk> chunks;
  for (int64_t len : lengths)
    chunks.push_back({.tokens = std::span<const int32_t>(tokens).first(size_t(len)),
                      .start_position = 0,
                      .blocks = std::span<const int32_t>(table).first(size_t((len + bs - 1) / bs))});
  const TensorView logits = logits_buf->view().rows(0, n_seqs);
  // Attention plans its splits from the longest context; the keys it reads stay the ones
  // there are, so the measured scratch is the longest context's without its cache.
  rank_steps.forward(chunks, scratch, logits, [&](model::StepInputs& in) {
    if (long_context) in.attn.max_seq_len = int(max_context);
  });
  if (!ranks.holds_rank0()) return;  // the logits and the sampler are node 0's
  std::vector<SampleRequest> rows(static_cast<size_t>(n_seqs));
  for (auto& r : rows) r.params = {.temperature = 1.0f, .top_p = 0.9f, .top_k = 50}, r.top_logprobs = 20;
  sampler.sample(ctx, logits, rows);
}

int64_t Engine::Impl::kv_pool_blocks() const {
  if (config.kv_blocks > 0) return config.kv_blocks;
  // Every rank holds a cache of the pool's blocks (its own heads of each): the pool is what the
  // fullest GPU affords.
  int64_t n = INT64_MAX;
  for (int r = 0; r < ranks.size(); ++r) n = std::min(n, kv_blocks_affordable(ranks.model(r), ranks.backend(r)));
  if (parallel::NodeGroup* nodes = ranks.nodes())
    for (const std::string& other : nodes->all_gather(std::to_string(n))) n = std::min(n, int64_t(std::stoll(other)));
  return n;
}

int64_t Engine::Impl::kv_blocks_affordable(const model::Model& m, const ops::Backend& b) const {
  const int64_t per_block = kv_bytes_per_block(m.kv_layout(), config.block_size, b.kv_dtype());
  const ops::MemoryInfo mem = b.memory_info();
  int64_t budget = config.kv_memory_bytes > 0 ? config.kv_memory_bytes : int64_t(256) << 20;
  std::string source = str_cat("--kv-memory (", budget, " bytes)");
  if (mem.total_bytes > 0) {
    // SGLang's --mem-fraction-static: weights and KV cache together take this fraction of
    // the device; what is in use now (weights, the measured step arena, the runtime, other
    // processes) counts.
    const int64_t used = mem.total_bytes - mem.free_bytes;
    int64_t left = int64_t(config.mem_fraction_static * double(mem.total_bytes)) - used;
    left = std::min(left, mem.free_bytes - (int64_t(256) << 20));  // room for the CUDA runtime
    auto gib = [](int64_t b) { return std::round(double(b) / (1 << 30) * 100) / 100; };
    TETRA_CHECK(config.kv_memory_bytes <= left, "--kv-memory asks for ", gib(config.kv_memory_bytes),
                " GiB for the KV cache, but --mem-fraction-static ", config.mem_fraction_static, " of ",
                gib(mem.total_bytes), " GiB with ", gib(used), " GiB in use leaves ",
                gib(std::max<int64_t>(0, left)), " GiB");
    budget = config.kv_memory_bytes > 0 ? config.kv_memory_bytes : left;
    source = str_cat("--mem-fraction-static ", config.mem_fraction_static, " of ", gib(mem.total_bytes),
                     " GiB with ", gib(used), " GiB in use (weights, step buffers, other processes) leaves ",
                     gib(std::max<int64_t>(0, left)), " GiB for the KV cache",
                     config.kv_memory_bytes > 0 ? str_cat(" (--kv-memory asks ", config.kv_memory_bytes, " bytes)") : "",
                     ";");
  }
  const int64_t n = per_block > 0 && budget > 0 ? budget / per_block : 0;
  TETRA_CHECK(n > 0, source, " that is less than one KV block of ", per_block, " bytes");
  return n;
}

std::vector<int64_t> Engine::Impl::graph_sizes() const {
  if (config.disable_cuda_graph) return {};
  if (backend.device() == Device::Cpu && !config.testing_eager_decode_graphs) return {};
  // Several ranks capture their collectives too: only communicators that never wait on the host.
  for (int r = 0; r < ranks.size(); ++r)
    if (ranks.comm(r) && !ranks.comm(r)->capturable() && !config.testing_eager_decode_graphs) return {};
  return decode_graph_sizes(std::min<int64_t>(config.cuda_graph_max_bs, capacity.max_seqs));
}

void Engine::Impl::capture_decode_graphs() {
  const std::vector<int64_t> sizes = graph_sizes();
  if (sizes.empty()) {
    if (!config.disable_cuda_graph && backend.device() != Device::Cpu)
      log_info("decode steps run eagerly: the ranks' communicator cannot be captured in a CUDA graph");
    return;
  }
  // Each rank captures its own on its thread, at once (NCCL's, if any, are collective).
  graphs.resize(size_t(ranks.size()));
  ranks.run([&](int r) {
    graphs[size_t(r)] = std::make_unique<DecodeGraphs>(
        ranks.model(r), ranks.backend(r), rank_steps.arena(r), rank_steps.context(r), rank_steps.builder(r),
        cache.layers(r), ranks.global_rank(r) == 0 ? logits_buf->view() : TensorView{}, sizes,
        config.testing_eager_decode_graphs);
  });
  if (!graphs.front()->active()) {
    graphs.clear();
    return;
  }
  const DecodeGraphs& g = *graphs.front();
  if (config.testing_eager_decode_graphs) {
    log_info("decode steps padded to ", sizes.size(), " graph batch sizes up to ", sizes.back(),
             ", run eagerly (testing)");
    return;
  }
  log_info("CUDA graphs: ", sizes.size(), " decode batch sizes (", sizes.front(), " .. ", sizes.back(),
           ") captured in ", std::round(g.capture_seconds() * 100) / 100, " s, ",
           std::round(double(g.capture_bytes()) / (1 << 20) * 10) / 10, " MiB of device memory",
           ranks.size() > 1 ? " a rank" : "", ", ", g.nodes_per_step(),
           " kernels a step; --disable-cuda-graph runs every step eagerly");
}

// vLLM's rule: one sequence of the full context must fit. A context the operator chose
// (--context-length) that does not is refused; the model's own is shortened, with a warning.
void Engine::Impl::fit_context_to_kv_cache() {
  const int64_t kv_tokens = n_blocks * config.block_size;
  if (kv_tokens >= max_context) return;
  TETRA_CHECK(config.max_context == 0, "--context-length ", max_context, " needs room for ", max_context,
              " tokens of KV cache, but it holds ", kv_tokens,
              "; lower --context-length or give the KV cache more memory (--kv-memory, --mem-fraction-static)");
  log_warn("the model's context of ", max_context, " tokens does not fit in the KV cache (", kv_tokens,
           " tokens); serving a context of ", kv_tokens,
           " tokens (give the KV cache more memory with --kv-memory or --mem-fraction-static, or choose "
           "one with --context-length)");
  max_context = kv_tokens;
}

SubmitResult Engine::Impl::validate(const RequestParams& p) const {
  auto invalid = [](std::string m) { return SubmitResult{0, SubmitError::Invalid, std::move(m)}; };
  if (p.prompt.empty()) return invalid("The prompt has no tokens.");
  for (int32_t id : p.prompt)
    if (id < 0 || id >= vocab)
      return invalid(str_cat("Prompt token id ", id, " is outside the vocabulary [0, ", vocab, ")."));
  if (p.max_new_tokens < 1)
    return invalid(str_cat("max_new_tokens must be at least 1, not ", p.max_new_tokens, "."));
  if (p.top_logprobs < 0 || p.top_logprobs > ops::kMaxTopLogprobs)
    return invalid(str_cat("top_logprobs must be between 0 and ", ops::kMaxTopLogprobs, ", not ",
                           p.top_logprobs, "."));
  const SamplingParams& s = p.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return invalid("temperature must be a finite number of at least 0.");
  if (!(s.top_p > 0 && s.top_p <= 1)) return invalid("top_p must be in (0, 1].");
  if (s.top_k < 0) return invalid("top_k cannot be negative.");
  if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty))
    return invalid("presence_penalty and frequency_penalty must be finite numbers.");
  if (!(std::isfinite(s.repetition_penalty) && s.repetition_penalty > 0))
    return invalid("repetition_penalty must be a finite number greater than 0.");

  const int64_t n_prompt = int64_t(p.prompt.size()), context = max_context;
  if (p.max_new_tokens > context)
    return {0, SubmitError::TooLong,
            str_cat("max_new_tokens (", p.max_new_tokens, ") alone exceeds the context of ", context, " tokens.")};
  if (n_prompt + p.max_new_tokens > context)
    return {0, SubmitError::TooLong,
            str_cat("The prompt (", n_prompt, " tokens) plus max_new_tokens (", p.max_new_tokens, ") is ",
                    n_prompt + p.max_new_tokens, " tokens, more than the context of ", context, " tokens.")};
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
  s.step_arena_bytes = arena.capacity_bytes();
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
  s.graph_steps = graph_steps;
  s.failed_steps = failed_steps;
  s.device_wait_s = sampler.wait_seconds();
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
  sample_rows.clear();
  for (const auto& c : chunks) {
    Request* r = c.request;
    seq_chunks.push_back({.tokens = std::span<const int32_t>(r->tokens).subspan(size_t(r->n_computed),
                                                                                size_t(c.n_tokens)),
                          .start_position = r->n_computed,
                          .blocks = r->table.blocks,
                          .want_logits = c.want_logits});
    if (c.want_logits)
      sample_rows.push_back({.params = r->params.sampling,
                             .seed = r->params.seed,
                             .position = r->n_tokens(),
                             .top_logprobs = r->params.top_logprobs,
                             .generated_counts = r->counts,
                             .prompt_tokens = r->prompt_distinct});
  }
  // A step of prompt chunks that all end mid-prompt wants no logits: zero rows.
  const TensorView logits = logits_buf->view().rows(0, int64_t(sample_rows.size()));
  std::span<const ops::SampledToken> sampled;
  const bool from_graph =
      !graphs.empty() && decode_only(chunks) && graphs.front()->covers(int64_t(chunks.size()));
  try {
    const bool inject = config.testing_fail_step == steps + failed_steps;
    if (inject && config.testing_fail_rank < 0)
      fail("injected fault at step ", config.testing_fail_step, " (TETRA_TESTING_FAIL_STEP)");
    const int fail_rank = inject ? config.testing_fail_rank : -1;
    const int64_t rows = int64_t(sample_rows.size());
    const std::string order =
        ranks.nodes() ? encode_step_order(seq_chunks, rows, from_graph, fail_rank) : std::string();
    ranks.run_step(order, [&](int r) { run_rank(r, seq_chunks, logits, from_graph, fail_rank); });
    sampled = sampler.sample(ctx, logits, sample_rows);
  } catch (const std::exception& e) {
    // The batch's requests cannot continue; the others keep their state and run next step.
    log_warn("engine step failed: ", e.what());
    ++failed_steps;
    publish_stats();  // health reports the failure before any client hears of it
    for (const auto& c : chunks) finish(c.request, FinishReason::Error, e.what());
    return;
  }
  ++steps;
  graph_steps += from_graph;
  size_t row = 0;
  for (const auto& c : chunks) post_process(c, c.want_logits ? &sampled[row++] : nullptr);
}

void Engine::Impl::run_rank(int r, const std::vector<SeqChunk>& chunks, TensorView logits, bool from_graph,
                            int fail_rank) {
  if (ranks.global_rank(r) == fail_rank)
    fail("injected fault on rank ", fail_rank, " (TETRA_TESTING_FAIL_RANK)");
  if (from_graph)
    graphs[size_t(r)]->run(chunks);
  else
    rank_steps.forward_rank(r, chunks, cache, logits);
}

void Engine::Impl::follow() {
  parallel::NodeGroup* nodes = ranks.nodes();
  TETRA_CHECK(nodes && nodes->node_rank() != 0, "only the nodes other than node 0 follow its steps");
  for (;;) {
    const std::optional<std::string> order = nodes->next_order();
    if (!order) {
      const std::string why = nodes->failure();
      TETRA_CHECK(why.empty(), "node 0 stopped the nodes after a failure (", why, ")");
      return;
    }
    std::string error;
    try {
      const StepOrder o = decode_step_order(*order);
      const std::vector<SeqChunk> chunks = o.seq_chunks();
      TETRA_CHECK(!o.from_graph || (!graphs.empty() && graphs.front()->covers(int64_t(chunks.size()))),
                  "node 0 sent a decode graph step of ", chunks.size(), " sequences, which this node did not capture");
      ranks.run([&](int r) { run_rank(r, chunks, TensorView{}, o.from_graph, o.fail_rank); });
      ++steps;
    } catch (const std::exception& e) {
      error = *e.what() ? e.what() : "a step failed";
      ++failed_steps;
      log_warn("step failed: ", error);
    }
    nodes->answer(error);
  }
}

void Engine::Impl::post_process(const ScheduledChunk& c, const ops::SampledToken* s) {
  Request* r = c.request;
  r->n_computed += c.n_tokens;
  // Only the client's prompt is cached: generated tokens are specific to one request.
  const int64_t cacheable = std::min(r->n_computed, r->prompt_len);
  blocks.register_blocks(std::span<const int32_t>(r->tokens).first(size_t(cacheable)), r->table);
  if (!c.want_logits) return;

  const RequestParams& p = r->params;
  TokenOutput t;
  t.token = s->token;
  t.logprob = s->logprob;
  for (int i = 0; i < s->n_top; ++i) t.top_logprobs.emplace_back(s->top_ids[i], s->top_logprobs[i]);
  r->tokens.push_back(s->token);
  count_token(r->counts, s->token);
  ++generated_tokens;

  FinishReason reason = FinishReason::None;
  const auto& eos = model.config().eos_token_ids;
  if (!p.ignore_eos && std::find(eos.begin(), eos.end(), s->token) != eos.end())
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

Engine::Engine(model::Model& model, ops::Backend& backend, EngineConfig config) {
  auto one = std::make_unique<ModelRanks>(model, backend);
  ModelRanks& ranks = *one;
  impl_ = std::make_unique<Impl>(std::move(one), ranks, std::move(config));
}

Engine::Engine(ModelRanks& ranks, EngineConfig config)
    : impl_(std::make_unique<Impl>(nullptr, ranks, std::move(config))) {}

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
  s.ranks_failure = impl_->ranks.failure();  // a node lost between steps shows at once
  return s;
}

void Engine::follow() { impl_->follow(); }

bool Engine::step() {
  Impl& s = *impl_;
  bool did = s.take_inbox();
  auto chunks = s.scheduler.schedule();
  // Admissions and preemptions show before any client hears of this step's tokens.
  s.publish_stats();
  if (!chunks.empty()) {
    did = true;
    // The thread stepping the engine (a server's engine thread) drives rank 0's device, which
    // need not be device 0 (--device cuda:N).
    s.backend.make_current();
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

int64_t default_chunked_prefill_size(const ops::Backend& backend) {
  const double gib = double(backend.memory_info().total_bytes) / double(int64_t(1) << 30);
  if (backend.device() != Device::Cuda || gib <= 0) return 512;
  return gib < 35 ? 2048 : gib < 60 ? 4096 : gib < 160 ? 8192 : 16384;
}

}  // namespace tetra::runtime
