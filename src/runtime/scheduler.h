// Forms each step's batch: every running sequence's next chunk (a decode token, or the next
// piece of a prompt within the step's prefill budget), then new requests from the queue while
// slots, budget and blocks allow. When blocks run out, the latest-arrived running request is
// preempted: its blocks are freed and it goes back to the front of the queue, keeping its
// generated tokens to recompute with the prompt (vLLM's recompute preemption). A queued
// request whose prompt starts with blocks a running request is still computing waits for
// them to reach the prefix cache.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/request.h"

namespace tetra::runtime {

struct SchedulerConfig {
  int max_running_requests = 64;
  int64_t chunked_prefill_size = 512;  // prompt tokens per step at most (decodes not counted)
  // Benchmarks only (EngineConfig::bench_skip_prompt_forward): on first admission a prompt's
  // tokens but its last count as computed, their blocks allocated, so only the last one runs.
  bool skip_prompt_forward = false;
};

struct ScheduledChunk {
  Request* request = nullptr;
  int64_t n_tokens = 0;      // tokens [n_computed, n_computed + n_tokens) run this step
  bool want_logits = false;  // the chunk reaches the end of the sequence: sample after it
};

struct SchedulerStats {
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0, prefix_queried_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockManager& blocks) : config_(config), blocks_(blocks) {}

  void add(Request* request);  // to the back of the queue
  // Removes a request wherever it is and frees its blocks.
  void remove(Request* request);

  // The next step's chunks, running requests first (in arrival order), then admissions. Empty
  // when nothing can run.
  std::vector<ScheduledChunk> schedule();
  // Decode chunks for every running request, or empty when any of them is not in decode or
  // a block is missing (then the full schedule() decides).
  std::vector<ScheduledChunk> schedule_decodes();

  bool has_waiting() const { return !waiting_.empty(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t n_waiting() const { return int64_t(waiting_.size()); }
  int64_t n_running() const { return int64_t(running_.size()); }
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  const SchedulerStats& stats() const { return stats_; }

 private:
  void preempt(Request* request);
  int64_t blocks_to_next_token(const Request& r) const;
  // A running request is still computing prompt blocks that r shares: r waits for them to
  // be cached instead of computing the same prefix beside it (n choices of one prompt, a
  // system prompt shared by a burst of requests).
  bool awaits_shared_prefix(const Request& r) const;
  void insert_running(Request* request);

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // by arrival
  SchedulerStats stats_;
};

}  // namespace tetra::runtime
