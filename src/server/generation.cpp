#include "server/generation.h"

#include <ctime>
#include <random>

namespace tetra::server {
namespace {

// Outputs queued for one request beyond this mean its strand is starved: the request fails
// rather than letting the engine thread's memory grow without bound.
constexpr size_t kMaxPendingOutputs = 4096;

uint64_t random_u64() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

std::string make_id(Endpoint e) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", e == Endpoint::Completions ? "cmpl-" : "chatcmpl-",
                static_cast<unsigned long long>(random_u64()));
  return buf;
}

}  // namespace

Generation::Generation(ServerState& state, GenerationRequest request, std::vector<int32_t> prompt,
                       int64_t max_tokens, Clock::time_point arrival, GenerationExtras extras)
    : state_(state),
      engine_(*state.context.engine),
      request_(std::move(request)),
      prompt_(std::move(prompt)),
      max_tokens_(max_tokens),
      arrival_(arrival),
      extras_(std::move(extras)) {
  header_ = {.endpoint = request_.endpoint,
             .id = make_id(request_.endpoint),
             .created = int64_t(std::time(nullptr)),
             .model = state.context.model_names.front()};
  choices_.resize(size_t(request_.n));
  const bool parse = request_.endpoint == Endpoint::ChatCompletions &&
                     (extras_.chat.reasoning || extras_.chat.tool_format);
  for (Choice& c : choices_) {
    // Parsed output keeps special tokens: DeepSeek-V3's and Kimi K2's markers are special
    // tokens (vLLM's tool parsers turn skip_special_tokens off for the same reason).
    c.text = std::make_unique<TextStream>(*state.context.tokenizer, request_.stop,
                                          request_.skip_special_tokens && !parse);
    if (parse) c.chat = std::make_unique<ChatOutput>(extras_.chat);
    if (request_.logprobs)
      c.logprobs = std::make_unique<LogprobsBuilder>(request_.endpoint, *state.context.tokenizer);
  }
}

Generation::~Generation() { release(); }

void Generation::submit() {
  const uint64_t seed = request_.seed ? *request_.seed : random_u64();
  for (int i = 0; i < request_.n; ++i) {
    runtime::RequestParams p;
    p.prompt = prompt_;
    p.max_new_tokens = max_tokens_;
    p.sampling = {.temperature = request_.temperature,
                  .top_p = request_.top_p,
                  .top_k = request_.top_k,
                  .presence_penalty = request_.presence_penalty,
                  .frequency_penalty = request_.frequency_penalty,
                  .repetition_penalty = request_.repetition_penalty};
    p.seed = seed + uint64_t(i);  // n choices: seeds seed, seed+1, ...
    p.ignore_eos = request_.ignore_eos || !extras_.script.empty();  // a script ends where it ends
    p.top_logprobs = request_.logprobs ? request_.top_logprobs : 0;
    auto self = shared_from_this();
    runtime::SubmitResult r = engine_.submit(
        std::move(p), [self, i](const runtime::RequestOutput& o) { self->on_output(i, o); });
    if (r.error != runtime::SubmitError::None) {
      for (int j = 0; j < i; ++j) engine_.abort(choices_[size_t(j)].request_id);
      ApiError e{.status = 400, .message = r.message};
      switch (r.error) {
        case runtime::SubmitError::QueueFull:
          e = {.status = 429, .message = r.message.empty() ? "the server's request queue is full; retry later" : r.message,
               .type = "rate_limit_error", .code = "queue_full"};
          break;
        case runtime::SubmitError::TooLong:
          e.param = request_.endpoint == Endpoint::Completions ? "prompt" : "messages";
          e.code = "context_length_exceeded";
          break;
        case runtime::SubmitError::ShuttingDown:
          e = unavailable_error(r.message.empty() ? "the server is shutting down" : r.message);
          break;
        default:
          break;
      }
      if (e.message.empty()) e.message = "the engine refused the request";
      throw ApiException(std::move(e));
    }
    choices_[size_t(i)].request_id = r.request_id;
  }
  submitted_ = true;
  released_ = false;
  state_.active_generations.fetch_add(1);
}

void Generation::attach(Post post, std::function<void()> wake) {
  std::unique_lock lock(mutex_);
  post_ = std::move(post);
  wake_ = std::move(wake);
  if (!pending_.empty() && !scheduled_) {
    scheduled_ = true;
    Post p = post_;
    lock.unlock();
    p([self = shared_from_this()] { self->drain_pending(); });
  }
}

void Generation::on_output(int index, const runtime::RequestOutput& out) {
  std::unique_lock lock(mutex_);
  if (overflow_) return;
  if (pending_.size() >= kMaxPendingOutputs) overflow_ = true;
  else pending_.push_back({index, out});
  if (scheduled_ || !post_) return;
  scheduled_ = true;
  Post p = post_;
  lock.unlock();
  p([self = shared_from_this()] { self->drain_pending(); });
}

void Generation::drain_pending() {
  std::deque<Pending> batch;
  bool overflow = false;
  {
    std::lock_guard lock(mutex_);
    batch.swap(pending_);
    scheduled_ = false;
    overflow = overflow_;
  }
  for (const Pending& p : batch) handle(p.index, p.output);
  if (overflow && !complete_) fail("the server could not deliver this request's output fast enough");
  if (wake_) wake_();
}

void Generation::handle(int index, const runtime::RequestOutput& out) {
  Choice& c = choices_[size_t(index)];
  cached_tokens_ = std::max(cached_tokens_, out.cached_prompt_tokens);
  if (c.finish) {  // stopped by us (stop string) or the client left: only bookkeeping remains
    if (out.finish != runtime::FinishReason::None) c.engine_done = true;
    return;
  }
  if (complete_) return;
  const auto now = Clock::now();
  std::string delta;
  bool stopped = false;
  const double gap = out.tokens.empty() ? 0.0
                     : std::chrono::duration<double>(now - c.last_token).count() / double(out.tokens.size());
  const bool had_previous = c.completion_tokens > 0;
  const std::vector<int32_t>& script = extras_.script;
  bool script_done = false;
  for (size_t k = 0; k < out.tokens.size(); ++k) {
    runtime::TokenOutput t = out.tokens[k];
    if (!script.empty()) t.token = script[size_t(c.completion_tokens)];  // tests only
    if (c.completion_tokens == 0) {
      const double ttft = seconds_since(arrival_);
      state_.metrics.observe_ttft(ttft);
      if (ttft_s_ < 0) ttft_s_ = ttft;
    }
    else if (had_previous) state_.metrics.observe_inter_token(gap);
    ++c.completion_tokens;
    const int64_t offset = int64_t(c.full_text.size() + delta.size());
    // With special tokens kept for the parsers, the end-of-turn token is still not text.
    const bool eos = c.chat && out.finish == runtime::FinishReason::Stop && k + 1 == out.tokens.size();
    if (!eos) delta += c.text->push(t.token);
    if (c.logprobs) c.logprobs->add(t, offset);
    if (c.text->stopped()) {
      stopped = true;
      break;
    }
    if (!script.empty() && size_t(c.completion_tokens) == script.size()) {
      script_done = true;
      break;
    }
  }
  if (!out.tokens.empty()) c.last_token = now;

  const char* reason = nullptr;
  if (script_done && !stopped) {
    delta += c.text->finish();
    reason = "stop";
    if (out.finish == runtime::FinishReason::None) engine_.abort(c.request_id);
    else c.engine_done = true;
  } else if (stopped) {
    reason = "stop";
    if (out.finish == runtime::FinishReason::None) engine_.abort(c.request_id);
    else c.engine_done = true;
  } else if (out.finish != runtime::FinishReason::None) {
    c.engine_done = true;
    if (out.finish == runtime::FinishReason::Error) {
      fail(out.error.empty() ? "the engine failed on this request" : out.error);
      return;
    }
    delta += c.text->finish();
    reason = c.text->stopped() ? "stop" : runtime::finish_reason_name(out.finish);
  }
  c.full_text += delta;
  ChoiceDelta d = c.chat ? parse_chat(c, delta, reason != nullptr) : ChoiceDelta{.text = delta};
  // A turn that made tool calls ends with "tool_calls", as vLLM reports it.
  if (reason && !c.tool_calls.empty()) reason = "tool_calls";
  if (request_.stream) {
    const bool has_logprobs = c.logprobs && !c.logprobs->empty();
    const bool has_delta = !d.text.empty() || !d.reasoning.empty() || !d.tool_calls.is_null();
    if (has_delta || reason || has_logprobs || !c.sent_first) {
      const nlohmann::json lp = has_logprobs ? c.logprobs->take() : nlohmann::json(nullptr);
      out_ += sse_chunk(header_, index, d, !c.sent_first, lp, reason, request_.include_usage);
      c.sent_first = true;
    }
  }
  if (reason) finish_choice(c, reason);
}

ChoiceDelta Generation::parse_chat(Choice& c, const std::string& text, bool last) {
  ChatDelta parsed = c.chat->push(text);
  if (last) {
    ChatDelta tail = c.chat->finish();
    parsed.reasoning += tail.reasoning;
    parsed.content += tail.content;
    parsed.calls.insert(parsed.calls.end(), tail.calls.begin(), tail.calls.end());
  }
  ChoiceDelta d{.text = parsed.content, .reasoning = parsed.reasoning};
  c.content += parsed.content;
  c.reasoning += parsed.reasoning;
  for (IndexedToolCall& ic : parsed.calls) {
    char id[40];
    std::snprintf(id, sizeof id, "chatcmpl-tool-%016llx", static_cast<unsigned long long>(random_u64()));
    nlohmann::json call = {{"id", ic.call.id.empty() ? std::string(id) : ic.call.id},
                           {"type", "function"},
                           {"function", {{"name", ic.call.name}, {"arguments", ic.call.arguments}}}};
    c.tool_calls.push_back(call);
    call["index"] = ic.index;
    if (d.tool_calls.is_null()) d.tool_calls = nlohmann::json::array();
    d.tool_calls.push_back(std::move(call));
  }
  return d;
}

void Generation::finish_choice(Choice& c, const char* reason) {
  c.finish = reason;
  state_.metrics.count_finished(reason);
  state_.metrics.observe_e2e(seconds_since(arrival_));
  for (const Choice& other : choices_)
    if (!other.finish) return;
  complete();
}

void Generation::complete() {
  if (complete_) return;
  complete_ = true;
  Usage usage{.prompt_tokens = int64_t(prompt_.size()), .cached_tokens = cached_tokens_};
  for (const Choice& c : choices_) usage.completion_tokens += c.completion_tokens;
  if (request_.stream) {
    if (request_.include_usage) out_ += sse_usage_chunk(header_, usage);
    out_ += sse_done();
    return;
  }
  std::vector<FinalChoice> finals;
  for (Choice& c : choices_)
    finals.push_back({.text = c.chat ? c.content : c.full_text,
                      .reasoning = c.chat && c.chat->reasoning_enabled() ? std::optional(c.reasoning) : std::nullopt,
                      .tool_calls = c.tool_calls.empty() ? nlohmann::json(nullptr) : c.tool_calls,
                      .logprobs = c.logprobs ? c.logprobs->take() : nlohmann::json(nullptr),
                      .finish_reason = c.finish});
  out_ = final_body(header_, finals, usage);
  status_ = 200;
}

void Generation::fail(const std::string& message) {
  for (Choice& c : choices_) {
    if (!c.engine_done) engine_.abort(c.request_id);
    if (!c.finish) {
      c.finish = "error";
      state_.metrics.count_finished("error");
    }
  }
  complete_ = true;
  ApiError e{.status = 500, .message = message, .type = "server_error"};
  if (request_.stream) {
    // The 200 header is gone already: an error event, then [DONE], as vLLM and SGLang do.
    out_ += sse_error(e) + sse_done();
  } else {
    out_ = error_body(e);
    status_ = 500;
  }
}

bool Generation::take(std::string& out) {
  out.append(out_);
  out_.clear();
  return complete_;
}

void Generation::client_gone() {
  if (gone_) return;
  gone_ = true;
  if (!complete_) state_.metrics.count_disconnect();
  for (Choice& c : choices_) {
    if (!c.engine_done && submitted_) engine_.abort(c.request_id);
    if (!c.finish) c.finish = "abort";
  }
  release();
}

Generation::Summary Generation::summary() const {
  Summary s{.id = header_.id, .prompt_tokens = int64_t(prompt_.size()), .ttft_s = ttft_s_, .arrival = arrival_};
  for (const Choice& c : choices_) {
    s.generated_tokens += c.completion_tokens;
    if (!c.finish || s.finish.find(c.finish) != std::string::npos) continue;
    if (!s.finish.empty()) s.finish += ',';
    s.finish += c.finish;
  }
  return s;
}

void Generation::release() {
  if (!released_.exchange(true)) state_.active_generations.fetch_sub(1);
}

}  // namespace tetra::server
