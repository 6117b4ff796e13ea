#include "runtime/scheduler.h"

#include <algorithm>

namespace tetra::runtime {

void Scheduler::add(Request* request) {
  request->state = RequestState::Waiting;
  waiting_.push_back(request);
}

void Scheduler::remove(Request* request) {
  if (auto it = std::find(waiting_.begin(), waiting_.end(), request); it != waiting_.end())
    waiting_.erase(it);
  if (auto it = std::find(running_.begin(), running_.end(), request); it != running_.end())
    running_.erase(it);
  blocks_.release(request->table);
  request->n_computed = 0;
}

void Scheduler::insert_running(Request* request) {
  request->state = RequestState::Running;
  auto it = std::upper_bound(running_.begin(), running_.end(), request,
                             [](const Request* a, const Request* b) { return a->arrival < b->arrival; });
  running_.insert(it, request);
}

void Scheduler::preempt(Request* request) {
  running_.erase(std::find(running_.begin(), running_.end(), request));
  blocks_.release(request->table);
  request->n_computed = 0;
  request->state = RequestState::Waiting;
  ++request->preemptions;
  waiting_.push_front(request);
  ++stats_.preemptions;
}

int64_t Scheduler::blocks_to_next_token(const Request& r) const {
  // The uncomputed tokens plus the one to be sampled after them.
  return std::max<int64_t>(0, blocks_.blocks_for(r.n_tokens() + 1) - int64_t(r.table.blocks.size()));
}

bool Scheduler::awaits_shared_prefix(const Request& r) const {
  if (!blocks_.prefix_caching()) return false;
  const int64_t bs = blocks_.block_size();
  const int64_t matchable = (r.n_tokens() - 1) / bs * bs;
  for (const Request* p : running_) {
    // Only prompt blocks are cached, and those p has cached already are matched anyway.
    const int64_t cacheable = std::min(matchable, p->prompt_len / bs * bs);
    if (p->table.n_hashed * bs >= cacheable) continue;
    const auto a = r.tokens.begin(), b = p->tokens.begin();
    const int64_t common = std::mismatch(a, a + cacheable, b).first - a;
    if (common / bs > p->table.n_hashed) return true;
  }
  return false;
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> out;
  int64_t budget = config_.chunked_prefill_size;

  // Running sequences first, oldest first, so the oldest always progresses; a sequence that
  // needs a block it cannot get takes it from the latest arrival.
  for (size_t i = 0; i < running_.size();) {
    Request* r = running_[i];
    const int64_t left = r->n_uncomputed();
    const bool decode = left == 1;
    const int64_t n = decode ? 1 : std::min(left, budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    const int64_t need = blocks_.blocks_for(r->n_computed + n) - int64_t(r->table.blocks.size());
    bool self_preempted = false;
    while (!blocks_.can_allocate(need)) {
      Request* victim = running_.back();
      preempt(victim);
      if (victim == r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // r was the last running request
    blocks_.allocate(need, r->table);
    out.push_back({r, n, r->n_computed + n == r->n_tokens()});
    if (!decode) budget -= n;
    ++i;
  }
  // Blocks the running requests still need to reach their next token (the rest of a prompt,
  // or a decode crossing into a new block): kept out of admission, so that a request is not
  // admitted only to preempt itself or a neighbour on the next step.
  int64_t promised = 0;
  for (const Request* r : running_) promised += blocks_to_next_token(*r);

  // Then queued requests, in order, while slots, prefill budget and blocks last. Admission
  // never preempts: a request that does not fit waits for blocks to be freed.
  const int bs = blocks_.block_size();
  for (auto it = waiting_.begin(); it != waiting_.end() &&
                                   int64_t(running_.size()) < config_.max_running_requests &&
                                   budget > 0;) {
    Request* r = *it;
    if (awaits_shared_prefix(*r)) {
      ++it;
      continue;
    }
    // At least one token must run to produce logits, so the last one is never matched.
    const int64_t matched = blocks_.match_prefix(r->tokens, (r->n_tokens() - 1) / bs, r->table);
    r->n_computed = matched * bs;
    if (config_.skip_prompt_forward && r->preemptions == 0) r->n_computed = r->n_tokens() - 1;
    const int64_t n = std::min(r->n_uncomputed(), budget);
    const int64_t need = blocks_.blocks_for(r->n_computed + n) - int64_t(r->table.blocks.size());
    const int64_t whole = blocks_to_next_token(*r);
    if (!blocks_.can_allocate(promised + whole)) {
      blocks_.release(r->table);
      r->n_computed = 0;
      break;
    }
    blocks_.allocate(need, r->table);
    promised += whole - need;
    it = waiting_.erase(it);
    if (r->preemptions == 0) {
      r->cached_prompt_tokens = r->n_computed;
      stats_.prefix_hit_tokens += r->n_computed;
      stats_.prefix_queried_tokens += r->n_tokens();
    }
    insert_running(r);
    out.push_back({r, n, r->n_computed + n == r->n_tokens()});
    budget -= n;
  }
  // Chunks in running order keep the batch layout independent of when each was admitted.
  std::sort(out.begin(), out.end(), [](const ScheduledChunk& a, const ScheduledChunk& b) {
    return a.request->arrival < b.request->arrival;
  });
  return out;
}

std::vector<ScheduledChunk> Scheduler::schedule_decodes() {
  if (!waiting_.empty() || running_.empty()) return {};
  int64_t need = 0;
  for (const Request* r : running_) {
    if (r->n_uncomputed() != 1) return {};
    need += blocks_.blocks_for(r->n_tokens()) - int64_t(r->table.blocks.size());
  }
  if (!blocks_.can_allocate(need)) return {};
  std::vector<ScheduledChunk> out;
  for (Request* r : running_) {
    blocks_.allocate(blocks_.blocks_for(r->n_tokens()) - int64_t(r->table.blocks.size()), r->table);
    out.push_back({r, 1, true});
  }
  return out;
}

}  // namespace tetra::runtime
