// One request inside the engine: its tokens so far, how many of them the KV cache holds, its
// blocks and what its sampling needs. Owned by the engine thread; server threads never see it.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace tetra::runtime {

// The KV blocks of one sequence and how far its prompt blocks are registered in the prefix
// cache (the block manager reads and writes this; the scheduler only counts blocks).
struct BlockTable {
  std::vector<int32_t> blocks;
  int64_t n_hashed = 0;       // leading blocks already in the prefix cache
  uint64_t last_hash = 0;     // chained hash of block n_hashed - 1
};

enum class RequestState : uint8_t { Waiting, Running, Finished };

struct Request {
  Request(uint64_t id, uint64_t arrival, RequestParams params, OutputCallback on_output)
      : id(id), arrival(arrival), params(std::move(params)), on_output(std::move(on_output)) {
    tokens = this->params.prompt;
    prompt_len = int64_t(tokens.size());
    if (this->params.sampling.repetition_penalty != 1.0f) prompt_distinct = distinct_tokens(tokens);
  }

  int64_t n_tokens() const { return int64_t(tokens.size()); }
  int64_t n_generated() const { return n_tokens() - prompt_len; }
  // Tokens not yet in the KV cache; 1 for a sequence in decode.
  int64_t n_uncomputed() const { return n_tokens() - n_computed; }

  uint64_t id;
  uint64_t arrival;            // submission order; preemption takes the latest first
  RequestParams params;
  OutputCallback on_output;
  // Each generated token with how often it came, by id (the penalties read it). Draws need
  // no other state: a token depends on (seed, position) alone, in any batch.
  TokenCounts counts;
  // The prompt's distinct ids, sorted; filled only for a repetition penalty, which reads them.
  std::vector<int32_t> prompt_distinct;

  // The prompt followed by every generated token. After a preemption the generated tokens
  // stay here and are recomputed with the prompt.
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;      // the client's prompt, without generated tokens
  int64_t n_computed = 0;      // leading tokens whose K/V the cache holds
  int64_t cached_prompt_tokens = 0;  // prompt tokens first served from the prefix cache
  BlockTable table;
  RequestState state = RequestState::Waiting;
  int preemptions = 0;
};

}  // namespace tetra::runtime
