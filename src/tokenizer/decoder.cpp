#include "tokenizer/decoder.h"

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace tetra::tok {

namespace {

std::string repaired(std::string_view bytes) {
  return utf8_is_valid(bytes) ? std::string(bytes) : utf8_sanitize(bytes);
}

}  // namespace

std::string IncrementalDecoder::push(TokenId id) {
  TETRA_CHECK(id >= 0, "token id ", id, " is negative");
  std::optional<std::string_view> bytes = tokenizer_->token_bytes(id);
  if (!bytes || (options_.skip_special && tokenizer_->is_special(id))) return {};  // as decode()
  pending_.append(*bytes);
  // Everything up to a trailing, still-completable sequence can be released: the repair of
  // that prefix cannot depend on bytes that have not arrived.
  size_t keep = utf8_incomplete_tail(pending_);
  std::string out = repaired(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string IncrementalDecoder::finish() {
  std::string out = repaired(pending_);
  pending_.clear();
  return out;
}

}  // namespace tetra::tok
