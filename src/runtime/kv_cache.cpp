#include "runtime/kv_cache.h"

namespace tetra::runtime {

int64_t kv_bytes_per_block(const std::vector<model::KvLayerShape>& layout, int block_size,
                           DType dtype) {
  int64_t elems = 0;
  for (const auto& l : layout) elems += l.n_kv_heads * (l.k_dim + l.v_dim) + l.index_dim;
  return elems * block_size * dtype_bits(dtype) / 8;
}

KvCache::KvCache(ops::Backend& backend, const std::vector<model::KvLayerShape>& layout,
                 int block_size, int64_t n_blocks)
    : block_size_(block_size), n_blocks_(n_blocks) {
  TETRA_CHECK(block_size > 0 && n_blocks > 0, "the KV cache needs at least one block");
  const DType dt = backend.kv_dtype();
  for (const auto& l : layout) {
    auto k = backend.alloc(dt, {n_blocks, block_size, l.n_kv_heads, l.k_dim});
    auto v = backend.alloc(dt, {n_blocks, block_size, l.n_kv_heads, l.v_dim});
    // Zeros, so a padding row that reads a block nobody wrote yet (a graph-sized decode
    // batch's) sees finite values.
    backend.fill_zero(k->view());
    backend.fill_zero(v->view());
    ops::KvCacheLayer layer{k->view(), v->view(), {}, l.k_scale, l.v_scale};
    storage_.push_back(std::move(k));
    storage_.push_back(std::move(v));
    if (l.index_dim > 0) {
      auto index_k = backend.alloc(dt, {n_blocks, block_size, 1, l.index_dim});
      backend.fill_zero(index_k->view());
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
