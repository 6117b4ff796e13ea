#include "runtime/step_builder.h"

#include <algorithm>

namespace tetra::runtime {

StepBuilder::StepBuilder(ops::Backend& backend, int block_size, StepCapacity capacity)
    : backend_(backend), block_size_(block_size), capacity_(capacity) {
  TETRA_CHECK(capacity.max_tokens >= 1 && capacity.max_seqs >= 1 && capacity.max_blocks_per_seq >= 1,
              "a step needs room for at least one token, sequence and block");
  TETRA_CHECK(capacity.max_seqs * capacity.max_blocks_per_seq < (int64_t(1) << 31),
              "a step's block tables would hold more than 2^31 entries");
  int64_t at = 0;
  auto field = [&](int64_t n) {
    const Field f{at, n};
    at += (n + 63) / 64 * 64;  // 256-byte aligned arrays
    return f;
  };
  tokens_ = field(capacity.max_tokens);
  positions_ = field(capacity.max_tokens);
  slots_ = field(capacity.max_tokens);
  seq_starts_ = field(capacity.max_seqs + 1);
  seq_lens_ = field(capacity.max_seqs);
  tables_ = field(capacity.max_seqs * capacity.max_blocks_per_seq);
  rows_ = field(capacity.max_tokens);  // every_logit chunks want a row per token
  device_ = backend.alloc(DType::I32, {at});
  host_ = backend.alloc_host(at * 4);
}

model::StepInputs StepBuilder::build(const ops::Context& ctx, const std::vector<SeqChunk>& chunks,
                                     int64_t pad_to) {
  // The last step's uploads read this mirror when the stream reaches them: wait for them
  // before rewriting it. A step that samples has waited already (its tokens came back); a
  // step of prompt chunks that all end mid-prompt has not. (Overlapped scheduling will want
  // two mirrors instead.)
  backend_.synchronize();
  int32_t* host = host_->view().as<int32_t>();
  const int64_t n_real = int64_t(chunks.size()), n_seqs = std::max(n_real, pad_to),
                mbps = capacity_.max_blocks_per_seq;
  TETRA_CHECK(n_seqs >= 1 && n_seqs <= capacity_.max_seqs, "a step of ", n_seqs,
              " sequences does not fit the step builder's ", capacity_.max_seqs);
  int64_t n_tokens = 0, n_rows = 0, max_query = 0, max_len = 0;
  host[seq_starts_.offset] = 0;
  for (int64_t s = 0; s < n_real; ++s) {
    const SeqChunk& c = chunks[size_t(s)];
    TETRA_CHECK(!c.tokens.empty(), "a step chunk has no tokens");
    const int64_t n = int64_t(c.tokens.size()), end_position = c.start_position + n;
    TETRA_CHECK(n_tokens + n <= capacity_.max_tokens, "a step of more than ", capacity_.max_tokens,
                " tokens does not fit the step builder");
    TETRA_CHECK(end_position <= int64_t(c.blocks.size()) * block_size_, "a sequence of ",
                end_position, " tokens does not fit its ", c.blocks.size(), " KV blocks");
    TETRA_CHECK(int64_t(c.blocks.size()) <= mbps, "a sequence of ", c.blocks.size(),
                " KV blocks is longer than the step builder's ", mbps);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = c.start_position + i, t = n_tokens + i;
      host[tokens_.offset + t] = c.tokens[size_t(i)];
      host[positions_.offset + t] = int32_t(pos);
      host[slots_.offset + t] = c.blocks[size_t(pos / block_size_)] * block_size_ + int32_t(pos % block_size_);
    }
    if (c.every_logit)
      for (int64_t i = 0; i < n; ++i) host[rows_.offset + n_rows++] = int32_t(n_tokens + i);
    n_tokens += n;
    if (c.want_logits && !c.every_logit) host[rows_.offset + n_rows++] = int32_t(n_tokens - 1);
    host[seq_starts_.offset + s + 1] = int32_t(n_tokens);
    host[seq_lens_.offset + s] = int32_t(end_position);
    int32_t* table = host + tables_.offset + s * mbps;
    std::copy(c.blocks.begin(), c.blocks.end(), table);
    // Rows are read only up to each sequence's length; the rest is zeroed for tidiness.
    std::fill(table + c.blocks.size(), table + mbps, 0);
    max_query = std::max(max_query, n);
    max_len = std::max(max_len, end_position);
  }
  for (int64_t s = n_real; s < n_seqs; ++s) {
    TETRA_CHECK(n_tokens < capacity_.max_tokens, "a step padded to ", n_seqs, " sequences does not fit the step builder's ",
                capacity_.max_tokens, " tokens");
    host[tokens_.offset + n_tokens] = 0;
    host[positions_.offset + n_tokens] = 0;
    host[slots_.offset + n_tokens] = -1;
    host[rows_.offset + n_rows++] = int32_t(n_tokens);
    ++n_tokens;
    host[seq_starts_.offset + s + 1] = int32_t(n_tokens);
    host[seq_lens_.offset + s] = 1;
    std::fill_n(host + tables_.offset + s * mbps, mbps, 0);
    max_query = std::max<int64_t>(max_query, 1);
    max_len = std::max<int64_t>(max_len, 1);
  }

  model::StepInputs in;
  const TensorView dev = device_->view();
  auto upload = [&](const Field& f, int64_t n, Shape shape) {
    TensorView v{dev.as<int32_t>() + f.offset, DType::I32, shape, dev.device};
    if (n > 0) backend_.copy_from_host_async(ctx, v, host + f.offset);
    return v;
  };
  in.token_ids = upload(tokens_, n_tokens, {n_tokens});
  in.attn.positions = upload(positions_, n_tokens, {n_tokens});
  in.attn.slot_mapping = upload(slots_, n_tokens, {n_tokens});
  in.attn.seq_starts = upload(seq_starts_, n_seqs + 1, {n_seqs + 1});
  in.attn.seq_lens = upload(seq_lens_, n_seqs, {n_seqs});
  in.attn.block_tables = upload(tables_, n_seqs * mbps, {n_seqs, mbps});
  in.logit_rows = upload(rows_, n_rows, {n_rows});
  in.attn.n_tokens = int(n_tokens);
  in.attn.n_seqs = int(n_seqs);
  in.attn.block_size = block_size_;
  in.attn.max_blocks_per_seq = int(mbps);
  in.attn.max_query_len = int(max_query);
  in.attn.max_seq_len = int(max_len);
  return in;
}

}  // namespace tetra::runtime
