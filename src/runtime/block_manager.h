// KV block bookkeeping for the engine: reference counts over the pool's blocks, per-sequence
// block tables, and the prefix cache.
//
// Prefix cache: a full block of prompt tokens, once computed, is registered under a hash
// chained over its parent block's hash and its own token ids. The hash is SipHash-2-4 under a
// random per-process key, so clients cannot aim for collisions, and a hit is still verified
// against the block's stored token ids and its parent block (vLLM's CVE-2025-25183 served one
// request another's cache through Python's hash()). A block nobody references stays cached
// and reusable until allocation evicts it, least recently used first.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/request.h"

namespace tetra::runtime {

// SipHash-2-4 of `data` under the 128-bit key (k0, k1).
uint64_t siphash24(uint64_t k0, uint64_t k1, const void* data, size_t n_bytes);

class BlockManager {
 public:
  // hash(parent_hash, block_tokens); replaceable so tests can force collisions.
  using HashFn = std::function<uint64_t(uint64_t, std::span<const int32_t>)>;

  BlockManager(int64_t n_blocks, int block_size, bool prefix_caching);

  int block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  int64_t n_total() const { return allocator_.n_total(); }
  // Blocks no sequence references: never used, or cached and evictable.
  int64_t n_free() const { return allocator_.n_free() + int64_t(lru_.size()); }
  int64_t n_cached() const { return n_cached_; }
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }
  bool can_allocate(int64_t n) const { return n <= n_free(); }

  // For a table with no blocks yet: references the longest run of cached blocks (at most
  // max_blocks) whose tokens begin `tokens`, appends them, and returns how many matched.
  int64_t match_prefix(std::span<const int32_t> tokens, int64_t max_blocks, BlockTable& table);
  // Appends n blocks to the table (evicting cached ones if needed), or returns false and
  // changes nothing.
  bool allocate(int64_t n, BlockTable& table);
  // Registers the table's full blocks covered by `computed` (tokens whose K/V are written).
  void register_blocks(std::span<const int32_t> computed, BlockTable& table);
  // Drops the table's references; its cached blocks stay reusable, the rest return to the pool.
  void release(BlockTable& table);

  void set_hash_for_testing(HashFn hash) { hash_ = std::move(hash); }

 private:
  struct BlockInfo {
    int32_t refs = 0;
    bool cached = false;
    uint64_t hash = 0;
    uint64_t epoch = 0;               // bumped on eviction, so stale parent links never match
    int32_t parent = -1;              // the block before it in the sequence it was cached from
    uint64_t parent_epoch = 0;
    std::vector<int32_t> tokens;      // the block's token ids, checked on every hit
    std::list<int32_t>::iterator lru_pos;
  };

  uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) const;
  void evict(int32_t block);

  int block_size_;
  bool prefix_caching_;
  BlockAllocator allocator_;  // blocks holding nothing
  std::vector<BlockInfo> info_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::list<int32_t> lru_;    // cached blocks with no references, least recently used first
  int64_t n_cached_ = 0;
  uint64_t key0_ = 0, key1_ = 0;
  HashFn hash_;
};

}  // namespace tetra::runtime
