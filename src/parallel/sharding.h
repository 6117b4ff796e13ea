// What one rank of a model split by --tp and --ep holds (docs/ARCHITECTURE.md, "Tensor and
// expert parallelism"). Pure arithmetic: the weight loader asks it which rows, columns, heads
// and experts to take; nothing here touches a device.
#pragma once

#include <cstdint>

namespace tetra::parallel {

// --tp and --ep. The ranks are max(tp, ep): attention and dense MLPs split in tp parts (1:
// every rank holds them whole), routed experts split by id in ep groups.
struct Parallelism {
  int tp = 1, ep = 1;
  int world() const { return tp > ep ? tp : ep; }
};

// Throws one sentence unless tetra runs the pair: ep divides tp (SGLang's rule: the tp ranks
// are the MoE layer's ranks too), or tp is 1 (attention whole on every rank).
void check_parallelism(const Parallelism& p);

// Elements [begin, end) of one dimension.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Part `index` of `parts` of a dimension of n elements cut only at multiples of `granule`
// (16 for an NVFP4 weight's input columns: its scales cover 16 values each). Whole granules
// are dealt out as evenly as they go, the earlier parts taking one more, so a part may be
// empty (fewer granules than parts).
Range split(int64_t n, int parts, int index, int64_t granule = 1);

// One of `parts` parts of something, this rank's being `index`.
struct Part {
  int parts = 1, index = 0;
  bool whole() const { return parts == 1; }
};

// The query heads and KV heads of one rank's attention. KV heads are split like the query
// heads when tp divides them; with more ranks than KV heads each rank holds the one KV head
// its query heads read (replicated on tp / n_kv_heads ranks, as vLLM does).
struct HeadShard {
  int64_t q_begin = 0, n_q = 0;
  int64_t kv_begin = 0, n_kv = 0;
};
HeadShard split_heads(int64_t n_heads, int64_t n_kv_heads, Part tp);

struct RankShard {
  int rank = 0;
  Parallelism p;

  int world() const { return p.world(); }
  // Attention heads and dense MLPs: tp parts, or whole where tp is 1.
  Part attention() const { return {p.tp, p.tp > 1 ? rank : 0}; }
  // Routed experts: ep groups of ids; inside a group, each expert's width in world / ep parts.
  Part expert_ids() const { return {p.ep, rank / (world() / p.ep)}; }
  Part expert_width() const { return {world() / p.ep, rank % (world() / p.ep)}; }
  // The shared expert: its width over every rank (the MoE layer's sum is over all of them).
  Part shared_expert() const { return {world(), rank}; }
};

}  // namespace tetra::parallel
