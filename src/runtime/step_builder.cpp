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
  model::StepInputs in;
  in.attn.n_tokens = int(n_tokens);
  in.attn.n_seqs = int(n_seqs);
  in.attn.block_size = block_size_;
  in.attn.max_blocks_per_seq = int(max_blocks);
  struct Part {
    const std::vector<int32_t>& host;
    Shape shape;
    TensorView& view;
  };
  const Part parts[] = {{tokens, {n_tokens}, in.token_ids},
                        {positions, {n_tokens}, in.attn.positions},
                        {slots, {n_tokens}, in.attn.slot_mapping},
                        {seq_starts, {n_seqs + 1}, in.attn.seq_starts},
                        {tables, {n_seqs, max_blocks}, in.attn.block_tables},
                        {rows, {int64_t(rows.size())}, in.logit_rows}};
  staging_.clear();
  for (const Part& p : parts) staging_.insert(staging_.end(), p.host.begin(), p.host.end());
  const int64_t total = int64_t(staging_.size());
  if (!buffer_ || total > buffer_->view().numel()) {
    const int64_t grown = buffer_ ? 2 * buffer_->view().numel() : 0;  // doubling: few reallocations
    buffer_ = backend_.alloc(DType::I32, {std::max(total, grown)});
  }
  const TensorView all = buffer_->view();
  backend_.copy_from_host(TensorView{all.data, DType::I32, {total}, all.device}, staging_.data());
  int64_t offset = 0;
  for (const Part& p : parts) {
    p.view = TensorView{all.as<int32_t>() + offset, DType::I32, p.shape, all.device};
    offset += int64_t(p.host.size());
  }
  return in;
}

}  // namespace tetra::runtime
