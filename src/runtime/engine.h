// The serving engine: continuous batching of many requests over one model and a paged KV
// cache. Server threads submit and abort; one engine thread runs the step loop:
// schedule (pick decodes and prefill chunks, allocate blocks, preempt if needed) -> run
// (one Model::forward over the ragged batch) -> post-process (sample, stream, finish).
//
// Backend-agnostic: it deals in token ids and block ids and calls ops::Backend and
// model::Model only, so the CPU reference and the CUDA backend serve the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "runtime/ranks.h"
#include "runtime/sampler.h"

namespace tetra::runtime {

struct EngineConfig {
  int block_size = 16;                    // tokens per KV block
  int64_t kv_blocks = 0;                  // 0: sized from kv_memory_bytes
  // The KV cache's bytes (--kv-memory); 0: 256 MiB on the CPU, and on a GPU what
  // mem_fraction_static leaves.
  int64_t kv_memory_bytes = 0;
  // On a GPU, weights and KV cache together take this fraction of its memory (SGLang's
  // --mem-fraction-static); the rest is for step buffers and the runtime. Caps kv_memory_bytes.
  double mem_fraction_static = 0.85;
  int max_running_requests = 64;          // --max-running-requests
  int max_queued_requests = 1024;         // --max-queued-requests; beyond it submit() refuses
  // --chunked-prefill-size: prompt tokens per step at most (`tetra serve` without the flag:
  // default_chunked_prefill_size)
  int64_t chunked_prefill_size = 512;
  int num_continuous_decode_steps = 1;    // --num-continuous-decode-steps
  bool enable_prefix_caching = true;
  int64_t max_context = 0;                // 0: the model's max_position_embeddings
  // Decode steps of up to this many sequences replay CUDA graphs captured at startup
  // (SGLang's --cuda-graph-max-bs; capped by max_running_requests); where the backend has
  // none (the CPU), or with disable_cuda_graph (--disable-cuda-graph), every step is eager.
  int cuda_graph_max_bs = 256;
  bool disable_cuda_graph = false;
  // Tests only: every prefix-cache block gets the same hash, so only the check of a hit's
  // token ids and parent keeps requests apart.
  bool testing_constant_block_hash = false;
  // Tests only: the forward with this index (0-based, counting failed ones) throws, as a device
  // fault would; -1 never. `tetra serve` reads it from TETRA_TESTING_FAIL_STEP.
  int64_t testing_fail_step = -1;
  // Tests only: with several ranks, that fault is thrown on this rank's thread inside the
  // step, while the others wait for it in a collective; -1: on the engine thread, before it.
  // `tetra serve` reads it from TETRA_TESTING_FAIL_RANK.
  int testing_fail_rank = -1;
  // Tests only: decode steps are padded to the graph batch sizes as a replay pads them, but
  // run eagerly, on any backend (what a replay must match).
  bool testing_eager_decode_graphs = false;
  // Benchmarks only (`tetra bench decode --skip-prefill`): the KV cache starts random rather
  // than zeroed, and a prompt's tokens but its last count as computed when it is first
  // admitted: their blocks hold those random values, and only the last token runs. A long
  // context is then ready in one step, at the same cost per decode step; its tokens mean
  // nothing.
  bool bench_skip_prompt_forward = false;
};

// The prompt tokens a step takes where --chunked-prefill-size is not given: 512 on the CPU; on
// a GPU by its memory, as SGLang chooses (2,048 under 35 GB, 4,096 under 60, 8,192 under 160,
// 16,384 above). Fewer, larger chunks stream the experts' weights fewer times per prompt; a
// chunk holds up the decodes in its step for longer (docs/PERF.md measures both).
int64_t default_chunked_prefill_size(const ops::Backend& backend);

struct RequestParams {
  std::vector<int32_t> prompt;            // token ids, each in [0, vocab)
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool ignore_eos = false;
  int top_logprobs = 0;                   // alternatives reported per generated token (0..20)
};

enum class FinishReason : uint8_t { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

struct TokenOutput {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
};

// What the engine reports for a request after a step: the tokens it produced and, once,
// how it finished. Delivered on the engine thread; callbacks must not block.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<TokenOutput> tokens;
  FinishReason finish = FinishReason::None;
  std::string error;                      // with FinishReason::Error
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;       // served from the prefix cache
  int64_t completion_tokens = 0;
};

using OutputCallback = std::function<void(const RequestOutput&)>;

// Why a request was refused at submission; the message is one sentence for the client.
enum class SubmitError : uint8_t { None, QueueFull, TooLong, Invalid, ShuttingDown };

struct SubmitResult {
  uint64_t request_id = 0;
  SubmitError error = SubmitError::None;
  std::string message;
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_free = 0;
  int64_t kv_blocks_cached = 0;  // holding a reusable prompt prefix (free ones included)
  int64_t prefix_cache_hit_tokens = 0, prefix_cache_queried_tokens = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;  // totals since start
  int64_t steps = 0;
  int64_t graph_steps = 0;   // of them, decode steps run from a decode graph (or its eager twin)
  int64_t failed_steps = 0;  // forwards that threw (a device fault): their requests got Error
  double device_wait_s = 0;  // seconds the engine thread waited for the device to finish steps
  int64_t step_arena_bytes = 0;  // rank 0's step arena, sized by the measuring pass
  std::string ranks_failure;      // why the ranks' group ended (a rank failed, a node lost); empty while it stands
};

class Engine {
 public:
  Engine(model::Model& model, ops::Backend& backend, EngineConfig config);
  // Over a model's ranks (--tp/--ep), which outlive the engine: every step runs on all of
  // them; rank 0's logits are sampled. With several ranks a failed step is the end of the
  // group (its communicators stay aborted): every later step fails too.
  Engine(ModelRanks& ranks, EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Validates and queues; never blocks on the engine thread. On success the
  // callback is called on the engine thread with each step's tokens, and exactly once with
  // a finish reason (then never again). Refused requests never call it.
  SubmitResult submit(RequestParams params, OutputCallback on_output);
  // Thread-safe. Finishes the request with FinishReason::Abort and frees its blocks before
  // the next step. Unknown or finished ids are ignored.
  void abort(uint64_t request_id);

  // Runs the step loop on the calling thread until stop(), sleeping while there is nothing
  // to do; or one step for tests (never both at once). When run() returns, every request
  // still queued or running has been finished with FinishReason::Abort. A failing forward
  // ends only its batch's requests (FinishReason::Error, counted in failed_steps); any other
  // exception is a bug and leaves run() to the caller.
  void run();
  bool step();  // false when there was nothing to do
  // The nodes other than node 0 (--nnodes): runs the steps node 0 sends on this node's ranks
  // until node 0 says stop. Throws once node 0 is lost, or when it stopped after a failure.
  void follow();
  // Thread-safe. stop_accepting() makes submit() refuse (ShuttingDown); stop() ends run()
  // after the current step and refuses further submissions too.
  void stop_accepting();
  void stop();
  // Thread-safe. Aborts every running and waiting request (drain timeout reached).
  void abort_all();

  EngineStats stats() const;  // thread-safe snapshot
  const EngineConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tetra::runtime
