#include "runtime/block_manager.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "core/error.h"

namespace tetra::runtime {
namespace {

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);
    v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);
  }
  void absorb(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

uint64_t load_le64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= uint64_t(p[i]) << (8 * i);
  return x;
}

}  // namespace

uint64_t siphash24(uint64_t k0, uint64_t k1, const void* data, size_t n_bytes) {
  const auto* m = static_cast<const uint8_t*>(data);
  SipState s{k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull, k0 ^ 0x6c7967656e657261ull,
             k1 ^ 0x7465646279746573ull};
  const size_t whole = n_bytes - n_bytes % 8;
  for (size_t i = 0; i < whole; i += 8) s.absorb(load_le64(m + i));
  uint64_t last = uint64_t(n_bytes & 0xff) << 56;
  for (size_t i = whole; i < n_bytes; ++i) last |= uint64_t(m[i]) << (8 * (i - whole));
  s.absorb(last);
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

BlockManager::BlockManager(int64_t n_blocks, int block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching), allocator_(n_blocks),
      info_(static_cast<size_t>(n_blocks)) {
  TETRA_CHECK(block_size > 0, "the KV block size must be positive");
  std::random_device rd;
  key0_ = (uint64_t(rd()) << 32) ^ rd();
  key1_ = (uint64_t(rd()) << 32) ^ rd();
}

uint64_t BlockManager::hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) const {
  if (hash_) return hash_(parent_hash, tokens);
  std::vector<uint8_t> bytes(8 + tokens.size() * 4);
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = uint8_t(parent_hash >> (8 * i));
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int i = 0; i < 4; ++i) bytes[8 + 4 * t + size_t(i)] = uint8_t(uint32_t(tokens[t]) >> (8 * i));
  return siphash24(key0_, key1_, bytes.data(), bytes.size());
}

int64_t BlockManager::match_prefix(std::span<const int32_t> tokens, int64_t max_blocks,
                                   BlockTable& table) {
  TETRA_CHECK(table.blocks.empty(), "match_prefix needs a sequence without blocks");
  if (!prefix_caching_) return 0;
  const int64_t n = std::min<int64_t>(max_blocks, int64_t(tokens.size()) / block_size_);
  uint64_t parent_hash = 0;
  int32_t parent = -1;
  for (int64_t i = 0; i < n; ++i) {
    const auto block_tokens = tokens.subspan(size_t(i * block_size_), size_t(block_size_));
    const uint64_t h = hash_block(parent_hash, block_tokens);
    const auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int32_t b = it->second;
    const BlockInfo& bi = info_[size_t(b)];
    // The hash only finds a candidate; the tokens and the parent link decide.
    const bool same_parent =
        bi.parent == parent && (parent < 0 || bi.parent_epoch == info_[size_t(parent)].epoch);
    if (!bi.cached || !same_parent ||
        !std::equal(bi.tokens.begin(), bi.tokens.end(), block_tokens.begin(), block_tokens.end()))
      break;
    if (info_[size_t(b)].refs++ == 0) lru_.erase(info_[size_t(b)].lru_pos);
    table.blocks.push_back(b);
    parent_hash = h;
    parent = b;
  }
  table.n_hashed = int64_t(table.blocks.size());
  table.last_hash = parent_hash;
  return table.n_hashed;
}

void BlockManager::evict(int32_t block) {
  BlockInfo& bi = info_[size_t(block)];
  const auto it = by_hash_.find(bi.hash);
  if (it != by_hash_.end() && it->second == block) by_hash_.erase(it);
  bi.cached = false;
  bi.tokens.clear();
  bi.parent = -1;
  ++bi.epoch;
  --n_cached_;
}

bool BlockManager::allocate(int64_t n, BlockTable& table) {
  if (n <= 0) return true;
  if (!can_allocate(n)) return false;
  // Never-used blocks first, so cached prefixes live as long as possible.
  const int64_t from_pool = std::min(n, allocator_.n_free());
  const size_t first = table.blocks.size();
  allocator_.allocate(from_pool, table.blocks);
  for (int64_t i = from_pool; i < n; ++i) {
    const int32_t b = lru_.front();
    lru_.pop_front();
    evict(b);
    table.blocks.push_back(b);
  }
  for (size_t i = first; i < table.blocks.size(); ++i) info_[size_t(table.blocks[i])].refs = 1;
  return true;
}

void BlockManager::register_blocks(std::span<const int32_t> computed, BlockTable& table) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(int64_t(computed.size()) / block_size_,
                                         int64_t(table.blocks.size()));
  for (int64_t i = table.n_hashed; i < full; ++i) {
    const auto block_tokens = computed.subspan(size_t(i * block_size_), size_t(block_size_));
    const int32_t b = table.blocks[size_t(i)];
    BlockInfo& bi = info_[size_t(b)];
    const uint64_t h = hash_block(table.last_hash, block_tokens);
    if (!bi.cached) {
      bi.cached = true;
      bi.hash = h;
      bi.tokens.assign(block_tokens.begin(), block_tokens.end());
      bi.parent = i > 0 ? table.blocks[size_t(i - 1)] : -1;
      bi.parent_epoch = bi.parent >= 0 ? info_[size_t(bi.parent)].epoch : 0;
      ++n_cached_;
      by_hash_[h] = b;  // the newest copy wins; an older one stays valid until evicted
    }
    table.last_hash = h;
    table.n_hashed = i + 1;
  }
}

void BlockManager::release(BlockTable& table) {
  // Last blocks first, so the tail of a prefix is evicted before its head.
  std::vector<int32_t> to_pool;
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) {
    BlockInfo& bi = info_[size_t(*it)];
    TETRA_CHECK(bi.refs > 0, "KV block ", *it, " released more often than it was taken");
    if (--bi.refs > 0) continue;
    if (bi.cached) {
      bi.lru_pos = lru_.insert(lru_.end(), *it);
    } else {
      to_pool.push_back(*it);
    }
  }
  std::reverse(to_pool.begin(), to_pool.end());
  allocator_.release(to_pool);
  table = BlockTable{};
}

}  // namespace tetra::runtime
