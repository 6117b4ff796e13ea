#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace tetra::tok {

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;  // load factor <= 0.5 keeps probe chains short
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  n_ = 0;
}

bool MergeTable::insert(TokenId left, TokenId right, Merge merge) {
  if ((n_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(16, old.size()));
    for (const Slot& s : old)
      if (s.key != kEmpty) insert(static_cast<TokenId>(s.key >> 32), static_cast<TokenId>(s.key), s.merge);
  }
  uint64_t key = pack(left, right);
  for (size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
    Slot& s = slots_[slot];
    if (s.key == key) return false;
    if (s.key == kEmpty) {
      s.key = key;
      s.merge = merge;
      ++n_;
      return true;
    }
  }
}

namespace {

void refuse_if_set(const nlohmann::json& model, const char* key) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null()) return;
  if (it->is_string() && it->get<std::string>().empty()) return;
  if (it->is_boolean() && !it->get<bool>()) return;
  fail("tokenizer.json: BPE option '", key, "' = ", it->dump(), " is not supported");
}

}  // namespace

BpeModel BpeModel::from_json(const nlohmann::json& model) {
  using nlohmann::json;
  TETRA_CHECK(model.is_object(), "tokenizer.json: 'model' is not an object");
  std::string type = model.value("type", std::string("BPE"));
  TETRA_CHECK(type == "BPE", "tokenizer.json: model type '", type,
              "' is not supported (only byte-level BPE is)");
  refuse_if_set(model, "dropout");
  refuse_if_set(model, "continuing_subword_prefix");
  refuse_if_set(model, "end_of_word_suffix");
  refuse_if_set(model, "byte_fallback");
  refuse_if_set(model, "unk_token");

  BpeModel bpe;
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  const json& vocab = model.at("vocab");
  TETRA_CHECK(vocab.is_object(), "tokenizer.json: model.vocab is not an object");
  bpe.vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    TETRA_CHECK(it.value().is_number_integer(), "tokenizer.json: vocab entry '", it.key(),
                "' has a non-integer id");
    int64_t id = it.value().get<int64_t>();
    TETRA_CHECK(id >= 0 && id < (1 << 30), "tokenizer.json: vocab id ", id, " is out of range");
    bpe.vocab_[it.key()] = static_cast<TokenId>(id);
    bpe.max_id_ = std::max(bpe.max_id_, static_cast<TokenId>(id));
  }
  const ByteLevelTable& table = byte_level_table();
  for (int b = 0; b < 256; ++b) {
    auto it = bpe.vocab_.find(table.byte_to_utf8[b]);
    bpe.byte_ids_[b] = it == bpe.vocab_.end() ? -1 : it->second;
  }

  const json& merges = model.at("merges");
  TETRA_CHECK(merges.is_array(), "tokenizer.json: model.merges is not an array");
  bpe.merges_.reserve(merges.size());
  uint32_t rank = 0;
  for (const json& m : merges) {
    std::string left, right;
    // Two spellings: "a b" (split on the one space) and ["a", "b"].
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      TETRA_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                  "tokenizer.json: merge '", s, "' is not two tokens separated by one space");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail("tokenizer.json: merge ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto l = bpe.vocab_.find(left), r = bpe.vocab_.find(right), lr = bpe.vocab_.find(left + right);
    TETRA_CHECK(l != bpe.vocab_.end() && r != bpe.vocab_.end() && lr != bpe.vocab_.end(),
                "tokenizer.json: merge '", left, " ", right, "' uses a token missing from the vocab");
    bpe.merges_.insert(l->second, r->second, {rank, lr->second});
    ++rank;
  }
  return bpe;
}

BpeModel BpeModel::from_ranks(const std::vector<std::string>& rank_bytes) {
  const ByteLevelTable& table = byte_level_table();
  BpeModel bpe;
  bpe.byte_ids_.fill(-1);
  bpe.vocab_.reserve(rank_bytes.size());
  std::unordered_map<std::string_view, TokenId> by_bytes;
  by_bytes.reserve(rank_bytes.size());
  for (size_t r = 0; r < rank_bytes.size(); ++r) {
    std::string token;  // the byte-level spelling, as tokenizer.json's vocab writes it
    for (unsigned char b : rank_bytes[r]) token += table.byte_to_utf8[b];
    bpe.vocab_.emplace(std::move(token), TokenId(r));
    by_bytes.emplace(rank_bytes[r], TokenId(r));
    if (rank_bytes[r].size() == 1) bpe.byte_ids_[static_cast<unsigned char>(rank_bytes[r][0])] = TokenId(r);
  }
  bpe.max_id_ = TokenId(rank_bytes.size()) - 1;
  for (int b = 0; b < 256; ++b)
    TETRA_CHECK(bpe.byte_ids_[b] >= 0, "tiktoken model: the single byte ", b, " is not a token");
  bpe.merges_.reserve(rank_bytes.size() * 4);
  for (size_t r = 0; r < rank_bytes.size(); ++r) {
    const std::string_view t = rank_bytes[r];
    for (size_t k = 1; k < t.size(); ++k) {
      auto l = by_bytes.find(t.substr(0, k));
      if (l == by_bytes.end()) continue;
      auto rt = by_bytes.find(t.substr(k));
      if (rt == by_bytes.end()) continue;
      bpe.merges_.insert(l->second, rt->second, {uint32_t(r), TokenId(r)});
    }
  }
  return bpe;
}

// Short pieces (nearly all of them): keep the rank of each adjacent pair in an array and scan
// it for the minimum; the scan is cheaper than a heap below a few hundred symbols.
size_t BpeModel::merge_small(TokenId* sym, size_t n) const {
  constexpr uint32_t kNone = ~0u;
  uint32_t rank_buf[256];
  TokenId id_buf[256];
  auto lookup = [&](size_t i) {
    const MergeTable::Merge* m = merges_.find(sym[i], sym[i + 1]);
    rank_buf[i] = m ? m->rank : kNone;
    id_buf[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = kNone;
    for (size_t i = 0; i + 1 < n; ++i)
      if (rank_buf[i] < best_rank) best_rank = rank_buf[i], best = i;  // strict <: leftmost wins
    if (best_rank == kNone) break;
    sym[best] = id_buf[best];
    for (size_t i = best + 1; i + 1 < n; ++i) sym[i] = sym[i + 1];
    for (size_t i = best + 1; i + 1 < n - 1; ++i) rank_buf[i] = rank_buf[i + 1], id_buf[i] = id_buf[i + 1];
    --n;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  return n;
}

// Long pieces (a 1 MB run of letters is one piece): a heap of candidate merges over a linked
// list, O(n log n), so hostile input cannot make encoding quadratic.
void BpeModel::merge_large(std::vector<TokenId>& sym) const {
  size_t n = sym.size();
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    uint64_t key;  // rank << 32 | position of the left symbol: lowest rank, then leftmost
    TokenId left, right, merged;
    bool operator>(const Cand& o) const { return key > o.key; }
  };
  std::vector<Cand> storage;
  storage.reserve(n);
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap(std::greater<Cand>(), std::move(storage));
  auto push = [&](int32_t i) {
    int32_t j = next[i];
    if (j < 0) return;
    if (const MergeTable::Merge* m = merges_.find(sym[i], sym[j]))
      heap.push({(static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(i), sym[i], sym[j], m->id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int32_t i = static_cast<int32_t>(c.key & 0xFFFFFFFFu), j = next[i];
    // Stale entries: a symbol changed since this candidate was pushed.
    if (!alive[i] || j < 0 || sym[i] != c.left || sym[j] != c.right) continue;
    sym[i] = c.merged;
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) sym[w++] = sym[i];
  sym.resize(w);
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<TokenId>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    std::string key;
    const ByteLevelTable& table = byte_level_table();
    for (unsigned char b : bytes) key += table.byte_to_utf8[b];
    if (auto it = vocab_.find(key); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // A byte missing from the vocab is dropped, as HF BPE does without an unk token.
  if (bytes.size() <= 256) {
    TokenId sym[256];
    size_t n = 0;
    for (unsigned char b : bytes)
      if (byte_ids_[b] >= 0) sym[n++] = byte_ids_[b];
    n = merge_small(sym, n);
    out.insert(out.end(), sym, sym + n);
    return;
  }
  std::vector<TokenId> sym;
  sym.reserve(bytes.size());
  for (unsigned char b : bytes)
    if (byte_ids_[b] >= 0) sym.push_back(byte_ids_[b]);
  merge_large(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

}  // namespace tetra::tok
