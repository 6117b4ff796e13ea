#include "runtime/step_builder.h"

#include <algorithm>

namespace tetra::runtime {

model::StepInputs StepBuilder::build(const std::vector<SeqChunk>& chunks) {
  std::vector<int32_t> tokens, positions, slots, seq_starts{0}, rows, tables;
  int64_t max_blocks = 1;
  for (const auto& c : chunks) max_blocks = std::max<int64_t>(max_blocks, int64_t(c.blocks.size()));
  for (const auto& c : chunks) {
    TETRA_CHECK(!c.tokens.empty(), "a step chunk has no tokens");
    const int64_t end_position = c.start_position + int64_t(c.tokens.size());
    TETRA_CHECK(end_position <= int64_t(c.blocks.size()) * block_size_, "a sequence of ",
                end_position, " tokens does not fit its ", c.blocks.size(), " KV blocks");
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int64_t pos = c.start_position + int64_t(i);
      tokens.push_back(c.tokens[i]);
      positions.push_back(int32_t(pos));
      slots.push_back(c.blocks[size_t(pos / block_size_)] * block_size_ + int32_t(pos % block_size_));
    }
    if (c.want_logits) rows.push_back(int32_t(tokens.size()) - 1);
    seq_starts.push_back(int32_t(tokens.size()));
    for (int64_t b = 0; b < max_blocks; ++b)
      tables.push_back(b < int64_t(c.blocks.size()) ? c.blocks[size_t(b)] : 0);
  }
  const int64_t n_tokens = int64_t(tokens.size()), n_seqs = int64_t(chunks.size());
  // Staged in this order; next() below hands out the views in the same order.
  const std::vector<int32_t>* arrays[] = {&tokens, &positions, &slots, &seq_starts, &tables, &rows};
  staging_.clear();
  for (const auto* a : arrays) staging_.insert(staging_.end(), a->begin(), a->end());
  const int64_t total = int64_t(staging_.size());
  if (!buffer_ || total > capacity_) {
    capacity_ = std::max<int64_t>(total, 2 * capacity_);
    buffer_ = backend_.alloc(DType::I32, {capacity_});
  }
  const TensorView all = buffer_->view();
  backend_.copy_from_host(TensorView{all.data, DType::I32, {total}, all.device}, staging_.data());
  int64_t offset = 0;
  auto next = [&](const std::vector<int32_t>& a, Shape shape) {
    TensorView v{all.as<int32_t>() + offset, DType::I32, shape, all.device};
    offset += int64_t(a.size());
    return v;
  };
  model::StepInputs in;
  in.token_ids = next(tokens, {n_tokens});
  in.attn.n_tokens = int(n_tokens);
  in.attn.n_seqs = int(n_seqs);
  in.attn.block_size = block_size_;
  in.attn.max_blocks_per_seq = int(max_blocks);
  in.attn.positions = next(positions, {n_tokens});
  in.attn.slot_mapping = next(slots, {n_tokens});
  in.attn.seq_starts = next(seq_starts, {n_seqs + 1});
  in.attn.block_tables = next(tables, {n_seqs, max_blocks});
  in.logit_rows = next(rows, {int64_t(rows.size())});
  return in;
}

}  // namespace tetra::runtime
