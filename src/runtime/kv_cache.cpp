#include "runtime/kv_cache.h"

namespace tetra::runtime {

int64_t kv_bytes_per_block(const std::vector<model::KvLayerShape>& layout, int block_size,
                           DType dtype) {
  int64_t elems = 0;
  for (const auto& l : layout) elems += l.n_kv_heads * (l.k_dim + l.v_dim) + l.index_dim;
  return elems * block_size * dtype_bits(dtype) / 8;
}

KvCache::KvCache(ops::Backend& backend, const std::vector<model::KvLayerShape>& layout,
                 int block_size, int64_t n_blocks, std::optional<uint64_t> random_seed)
    : block_size_(block_size), n_blocks_(n_blocks) {
  TETRA_CHECK(block_size > 0 && n_blocks > 0, "the KV cache needs at least one block");
  const DType dt = backend.kv_dtype();
  // Zeros, so a padding row that reads a block nobody wrote yet (a graph-sized decode
  // batch's) sees finite values. Random values are N(0, 1) in any cache dtype, a normed
  // latent's scale: the same draws in a BF16 and an FP8 cache (what the attention outputs, and
  // so the MoE routing of a benchmark's step, depend on).
  auto make = [&](Shape shape) {
    if (!random_seed) {
      auto b = backend.alloc(dt, shape);
      backend.fill_zero(b->view());
      return b;
    }
    return backend.random_tensor(dt, shape, {.kind = ops::RandomFill::Normal, .scale = 1.0f}, (*random_seed)++);
  };
  for (const auto& l : layout) {
    auto k = make({n_blocks, block_size, l.n_kv_heads, l.k_dim});
    auto v = make({n_blocks, block_size, l.n_kv_heads, l.v_dim});
    ops::KvCacheLayer layer{k->view(), v->view(), {}, l.k_scale, l.v_scale};
    storage_.push_back(std::move(k));
    storage_.push_back(std::move(v));
    if (l.index_dim > 0) {
      auto index_k = make({n_blocks, block_size, 1, l.index_dim});
      layer.index_k = index_k->view();
      storage_.push_back(std::move(index_k));
    }
    layers_.push_back(layer);
  }
}

BlockAllocator::BlockAllocator(int64_t n_blocks) : n_total_(n_blocks) {
  // Lowest ids are handed out first.
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

bool BlockAllocator::allocate(int64_t n, std::vector<int32_t>& blocks) {
  if (n > int64_t(free_.size())) return false;
  for (int64_t i = 0; i < n; ++i) {
    blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::release(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free_.push_back(*it);
}

}  // namespace tetra::runtime
