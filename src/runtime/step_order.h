// A step as node 0 sends it to the other nodes (--nnodes; parallel/node_group.h): the chunks
// every rank runs, how many logit rows it leaves, whether it replays a decode graph, and (tests
// only) the rank that fails it. Bytes; a malformed order is one sentence, thrown before any
// rank runs it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/step_builder.h"

namespace tetra::runtime {

struct StepOrder {
  struct Chunk {
    std::vector<int32_t> tokens, blocks;
    int64_t start_position = 0;
    bool want_logits = true, every_logit = false;
  };
  std::vector<Chunk> chunks;
  int64_t logit_rows = 0;
  bool from_graph = false;
  int fail_rank = -1;  // tests: this global rank throws instead of running the step

  std::vector<SeqChunk> seq_chunks() const;  // views into this order
};

std::string encode_step_order(const std::vector<SeqChunk>& chunks, int64_t logit_rows, bool from_graph,
                              int fail_rank);
StepOrder decode_step_order(std::string_view bytes);

}  // namespace tetra::runtime
