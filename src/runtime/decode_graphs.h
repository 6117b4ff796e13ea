// Decode steps replayed from CUDA graphs. A decode step of n sequences (one token each) is
// hundreds of small kernels whose launches cost more than their work at small n; captured
// once per batch size at startup, a step is one graph launch. A batch of n runs on the
// smallest captured size b >= n, its rows n..b-1 padding (StepBuilder::build's pad_to), as
// SGLang's decode graphs do.
//
// A graph replays the kernels and arguments it was captured with, so everything it reads
// sits at fixed addresses: the step builder's buffers (rewritten before each replay), the
// frozen step arena (the forward's scratch, from offset 0), the KV cache and the weights.
// Host-side choices that would vary per step are fixed at capture: decode attention plans
// its key splits from the step's capacity (the whole context), not the longest sequence, so
// the splits past a sequence's keys are blocks that exit at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"
#include "ops/ops.h"
#include "runtime/step_builder.h"

namespace tetra::runtime {

// The batch sizes captured up to max_bs: 1, 2, 4, 8, then every multiple of 8, and max_bs.
std::vector<int64_t> decode_graph_sizes(int64_t max_bs);

class DecodeGraphs {
 public:
  // Captures a graph per size on `backend`, or none where it has no graphs (the CPU); with
  // `eager` (tests), captures nothing and runs each padded step eagerly instead, the same
  // kernels a replay runs. The KV cache and logits buffer must outlive this. Ranks but the
  // first (--tp/--ep) write no logits: `logits` empty.
  DecodeGraphs(model::Model& model, ops::Backend& backend, ops::Arena& arena, const ops::Context& ctx,
               StepBuilder& builder, const std::vector<ops::KvCacheLayer>& cache, TensorView logits,
               std::vector<int64_t> sizes, bool eager);

  // Whether steps of n sequences run here (captured, or eager-padded for tests).
  bool covers(int64_t n) const { return active() && n >= 1 && n <= sizes_.back(); }
  bool active() const { return eager_ || !graphs_.empty(); }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  double capture_seconds() const { return capture_seconds_; }
  int64_t capture_bytes() const { return capture_bytes_; }
  // Kernels and copies of one step at the smallest size (0 when nothing was captured).
  int64_t nodes_per_step() const { return graphs_.empty() ? 0 : graphs_.front()->n_nodes(); }

  // One decode step of `chunks` (one token each, every one wanting logits); the logits of
  // chunk i land in row i of the logits buffer. Resets the arena.
  void run(const std::vector<SeqChunk>& chunks);

 private:
  size_t size_index(int64_t n) const;  // of the smallest captured size >= n
  TensorView logits_rows(int64_t b) const { return logits_.empty() ? TensorView{} : logits_.rows(0, b); }

  model::Model& model_;
  ops::Backend& backend_;
  ops::Arena& arena_;
  const ops::Context& ctx_;
  StepBuilder& builder_;
  const std::vector<ops::KvCacheLayer>& cache_;
  TensorView logits_;
  std::vector<int64_t> sizes_;
  bool eager_;
  std::vector<std::unique_ptr<ops::Graph>> graphs_;  // graphs_[i] runs sizes_[i]
  double capture_seconds_ = 0;
  int64_t capture_bytes_ = 0;
};

}  // namespace tetra::runtime
