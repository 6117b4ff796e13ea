#include "runtime/step_order.h"

#include <cstring>

#include "core/error.h"

namespace tetra::runtime {
namespace {

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_ints(std::string& out, std::span<const int32_t> v) {
  put<uint32_t>(out, uint32_t(v.size()));
  out.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }

  std::vector<int32_t> ints() {
    const uint32_t n = get<uint32_t>();
    need(size_t(n) * 4);
    std::vector<int32_t> v(n);
    std::memcpy(v.data(), bytes_.data() + at_, size_t(n) * 4);
    at_ += size_t(n) * 4;
    return v;
  }

  bool done() const { return at_ == bytes_.size(); }

 private:
  void need(size_t n) const {
    TETRA_CHECK(n <= bytes_.size() - at_, "a malformed step order from node 0 (cut short at byte ", at_, " of ",
                bytes_.size(), ")");
  }

  std::string_view bytes_;
  size_t at_ = 0;
};

}  // namespace

std::vector<SeqChunk> StepOrder::seq_chunks() const {
  std::vector<SeqChunk> out;
  for (const Chunk& c : chunks)
    out.push_back({.tokens = c.tokens,
                   .start_position = c.start_position,
                   .blocks = c.blocks,
                   .want_logits = c.want_logits,
                   .every_logit = c.every_logit});
  return out;
}

std::string encode_step_order(const std::vector<SeqChunk>& chunks, int64_t logit_rows, bool from_graph,
                              int fail_rank) {
  std::string out;
  put<int64_t>(out, logit_rows);
  put<uint8_t>(out, from_graph);
  put<int32_t>(out, fail_rank);
  put<uint32_t>(out, uint32_t(chunks.size()));
  for (const SeqChunk& c : chunks) {
    put<int64_t>(out, c.start_position);
    put<uint8_t>(out, uint8_t(c.want_logits) | uint8_t(c.every_logit) << 1);
    put_ints(out, c.tokens);
    put_ints(out, c.blocks);
  }
  return out;
}

StepOrder decode_step_order(std::string_view bytes) {
  Reader in(bytes);
  StepOrder o;
  o.logit_rows = in.get<int64_t>();
  o.from_graph = in.get<uint8_t>() != 0;
  o.fail_rank = in.get<int32_t>();
  const uint32_t n = in.get<uint32_t>();
  TETRA_CHECK(n <= bytes.size() / 17, "a malformed step order from node 0 (", n, " chunks in ", bytes.size(),
              " bytes)");
  for (uint32_t i = 0; i < n; ++i) {
    StepOrder::Chunk c;
    c.start_position = in.get<int64_t>();
    const uint8_t flags = in.get<uint8_t>();
    c.want_logits = flags & 1;
    c.every_logit = flags & 2;
    c.tokens = in.ints();
    c.blocks = in.ints();
    TETRA_CHECK(c.start_position >= 0 && !c.tokens.empty(), "a malformed step order from node 0 (chunk ", i,
                ": ", c.tokens.size(), " tokens from position ", c.start_position, ")");
    o.chunks.push_back(std::move(c));
  }
  TETRA_CHECK(in.done(), "a malformed step order from node 0 (bytes left over)");
  TETRA_CHECK(o.logit_rows >= 0 && o.logit_rows <= int64_t(bytes.size()), "a malformed step order from node 0 (",
              o.logit_rows, " logit rows)");
  return o;
}

}  // namespace tetra::runtime
