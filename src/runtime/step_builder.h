// Turns the token chunks the scheduler picked for one step (from any number of sequences)
// into the model's StepInputs, uploaded to the device in one go.
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
};

class StepBuilder {
 public:
  StepBuilder(ops::Backend& backend, int block_size) : backend_(backend), block_size_(block_size) {}

  // The returned inputs point into a buffer this builder owns until the next build().
  model::StepInputs build(const std::vector<SeqChunk>& chunks);

 private:
  ops::Backend& backend_;
  int block_size_;
  // All of a step's index arrays live in one device buffer, kept and grown across steps: a
  // step uploads its metadata in one copy and allocates nothing once the buffer is big enough.
  std::unique_ptr<ops::Buffer> buffer_;
  std::vector<int32_t> staging_;  // the host image of the buffer's used part
};

}  // namespace tetra::runtime
