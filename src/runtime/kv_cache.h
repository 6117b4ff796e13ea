// The paged KV cache: per layer, [n_blocks, block_size, n_kv_heads, dim] for keys and values,
// and the free list of its blocks. The runtime deals in block ids, never device pointers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/model.h"
#include "ops/ops.h"

namespace tetra::runtime {

// Bytes one block takes over all layers at the cache dtype (Backend::kv_dtype).
int64_t kv_bytes_per_block(const std::vector<model::KvLayerShape>& layout, int block_size,
                           DType dtype);

class KvCache {
 public:
  // Zeroed; or, with random_seed (benchmarks only), random values of the cache's scale, as
  // if every block held some prompt's keys and values.
  KvCache(ops::Backend& backend, const std::vector<model::KvLayerShape>& layout, int block_size,
          int64_t n_blocks, std::optional<uint64_t> random_seed = std::nullopt);

  int block_size() const { return block_size_; }
  int64_t n_blocks() const { return n_blocks_; }
  const std::vector<ops::KvCacheLayer>& layers() const { return layers_; }

 private:
  int block_size_;
  int64_t n_blocks_;
  std::vector<std::unique_ptr<ops::Buffer>> storage_;
  std::vector<ops::KvCacheLayer> layers_;
};

// Hands out block ids; all-or-nothing so a failed request leaves the pool unchanged.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t n_blocks);
  int64_t n_free() const { return int64_t(free_.size()); }
  int64_t n_total() const { return n_total_; }
  // Appends n blocks to `blocks`, or returns false and changes nothing.
  bool allocate(int64_t n, std::vector<int32_t>& blocks);
  void release(const std::vector<int32_t>& blocks);

 private:
  int64_t n_total_;
  std::vector<int32_t> free_;
};

}  // namespace tetra::runtime
