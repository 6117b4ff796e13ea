// The BPE model of a byte-level tokenizer.json: vocab, ranked merges, and the merge loop that
// turns one pre-tokenized piece (raw bytes) into token ids, as HF tokenizers' BPE does
// (repeatedly merge the adjacent pair of lowest rank, the leftmost one on ties).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tetra::tok {

using TokenId = int32_t;

// (left id, right id) -> (rank, merged id), open addressing: the merge loop does one lookup
// per adjacent pair, so this is the hot table.
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    TokenId id;
  };
  void reserve(size_t n);
  // Returns false if the pair was already present (the first rank wins, as in HF).
  bool insert(TokenId left, TokenId right, Merge merge);
  const Merge* find(TokenId left, TokenId right) const {
    uint64_t key = pack(left, right);
    for (size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
      const Slot& s = slots_[slot];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return n_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static uint64_t pack(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) >> 20; }
  std::vector<Slot> slots_;
  size_t mask_ = 0, n_ = 0;
};

class BpeModel {
 public:
  // Parses a tokenizer.json `model` object of type BPE; throws tetra::Error for anything
  // this engine does not implement (dropout, byte_fallback, subword prefixes, ...).
  static BpeModel from_json(const nlohmann::json& model);
  // A tiktoken model: token id = rank, and a merge (a, b) of rank(a+b) for every way of
  // splitting a token into two tokens (see tiktoken.cpp). `rank_bytes[r]`: the bytes of rank r;
  // every single byte must be among them.
  static BpeModel from_ranks(const std::vector<std::string>& rank_bytes);

  // Appends the ids of one piece of raw bytes (already pre-tokenized) to `out`.
  void encode_piece(std::string_view bytes, std::vector<TokenId>& out) const;

  const std::unordered_map<std::string, TokenId>& vocab() const { return vocab_; }
  TokenId max_id() const { return max_id_; }

 private:
  // Merges symbols[0..n) in place; returns the new count.
  size_t merge_small(TokenId* symbols, size_t n) const;
  void merge_large(std::vector<TokenId>& symbols) const;

  std::unordered_map<std::string, TokenId> vocab_;  // byte-level token string -> id
  std::array<TokenId, 256> byte_ids_{};             // id of each single-byte token, or -1
  MergeTable merges_;
  TokenId max_id_ = -1;
  bool ignore_merges_ = false;
};

}  // namespace tetra::tok
