// Turns the token chunks the scheduler picked for one step (from any number of sequences)
// into the model's StepInputs. Buffers have a fixed capacity and fixed addresses (a device
// buffer and its pinned host mirror), so no step allocates and every step's inputs live at the
// same place.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "ops/ops.h"

namespace tetra::runtime {

struct SeqChunk {
  std::span<const int32_t> tokens;    // the tokens this step runs for the sequence
  int64_t start_position = 0;         // position of tokens[0] in the sequence
  std::span<const int32_t> blocks;    // the sequence's KV blocks, covering every position
  bool want_logits = true;            // produce logits for the chunk's last token
  bool every_logit = false;           // or for every token of the chunk (scoring)
};

// The largest step a builder takes.
struct StepCapacity {
  int64_t max_tokens = 0;           // tokens of all sequences together
  int64_t max_seqs = 0;
  int64_t max_blocks_per_seq = 0;   // ceil(longest context / block size)
};

class StepBuilder {
 public:
  StepBuilder(ops::Backend& backend, int block_size, StepCapacity capacity);

  // The returned inputs point into this builder's device buffer until the next build().
  // Uploads are ordered on ctx's stream; build() first waits for the backend's queued work,
  // since the previous step's uploads read the host mirror it rewrites.
  //
  // `pad_to` > chunks.size() appends padding sequences up to that many (a CUDA graph's batch
  // size): one token each (id 0 at position 0, slot -1, so nothing is written), reading one
  // key of block 0, with a logits row.
  model::StepInputs build(const ops::Context& ctx, const std::vector<SeqChunk>& chunks, int64_t pad_to = 0);

  const StepCapacity& capacity() const { return capacity_; }

 private:
  // One array of the step's inputs: where it sits in the buffer and how long it may be.
  struct Field {
    int64_t offset = 0, capacity = 0;
  };

  ops::Backend& backend_;
  int block_size_;
  StepCapacity capacity_;
  Field tokens_, positions_, slots_, seq_starts_, seq_lens_, tables_, rows_;
  std::unique_ptr<ops::Buffer> device_;
  std::unique_ptr<ops::Buffer> host_;  // pinned mirror, laid out as device_
};

}  // namespace tetra::runtime
