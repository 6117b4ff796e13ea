#include "runtime/decode_graphs.h"

#include <algorithm>
#include <chrono>

namespace tetra::runtime {

std::vector<int64_t> decode_graph_sizes(int64_t max_bs) {
  std::vector<int64_t> sizes;
  for (int64_t b : {1, 2, 4, 8})
    if (b <= max_bs) sizes.push_back(b);
  for (int64_t b = 16; b <= max_bs; b += 8) sizes.push_back(b);
  if (max_bs >= 1 && sizes.back() != max_bs) sizes.push_back(max_bs);
  return sizes;
}

DecodeGraphs::DecodeGraphs(model::Model& model, ops::Backend& backend, ops::Arena& arena, const ops::Context& ctx,
                           StepBuilder& builder, const std::vector<ops::KvCacheLayer>& cache, TensorView logits,
                           std::vector<int64_t> sizes, bool eager)
    : model_(model), backend_(backend), arena_(arena), ctx_(ctx), builder_(builder), cache_(cache),
      logits_(logits), sizes_(std::move(sizes)), eager_(eager) {
  TETRA_CHECK(!sizes_.empty() && std::is_sorted(sizes_.begin(), sizes_.end()) && sizes_.front() >= 1 &&
                  sizes_.back() <= builder.capacity().max_seqs && (logits.empty() || sizes_.back() <= logits.dim(0)),
              "decode graph sizes must ascend from 1 to at most the step's ", builder.capacity().max_seqs,
              " sequences");
  if (eager_) return;
  const auto start = std::chrono::steady_clock::now();
  const int64_t free_before = backend.memory_info().free_bytes;
  for (int64_t b : sizes_) {
    // Padding rows only: they read block 0 and write nothing, so the live cache is untouched.
    const model::StepInputs in = builder_.build(ctx_, {}, b);
    arena_.reset();
    auto graph = backend_.capture(ctx_, [&] { model_.forward(ctx_, in, cache_, logits_rows(b)); });
    if (!graph) {  // the backend has no graphs
      graphs_.clear();
      return;
    }
    graphs_.push_back(std::move(graph));
  }
  backend_.synchronize();
  capture_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  capture_bytes_ = std::max<int64_t>(0, free_before - backend.memory_info().free_bytes);
}

size_t DecodeGraphs::size_index(int64_t n) const {
  const auto it = std::lower_bound(sizes_.begin(), sizes_.end(), n);
  TETRA_CHECK(it != sizes_.end(), "no decode graph holds ", n, " sequences");
  return size_t(it - sizes_.begin());
}

void DecodeGraphs::run(const std::vector<SeqChunk>& chunks) {
  const size_t i = size_index(int64_t(chunks.size()));
  const int64_t b = sizes_[i];
  for (const SeqChunk& c : chunks)
    TETRA_CHECK(c.tokens.size() == 1 && c.want_logits && !c.every_logit,
                "a graph decode step takes one token per sequence, each wanting its logits");
  const model::StepInputs in = builder_.build(ctx_, chunks, b);
  arena_.reset();
  if (eager_) {
    model_.forward(ctx_, in, cache_, logits_rows(b));
    return;
  }
  graphs_[i]->replay(ctx_);
}

}  // namespace tetra::runtime
