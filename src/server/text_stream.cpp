#include "server/text_stream.h"

#include <algorithm>

#include "core/error.h"

namespace tetra::server {

TextStream::TextStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stop, bool skip_special)
    : decoder_(tokenizer, tok::DecodeOptions{.skip_special = skip_special}), stop_(std::move(stop)) {}

std::string TextStream::push(int32_t token) {
  if (stopped_) return {};
  try {
    held_ += decoder_.push(token);
  } catch (const Error&) {
    // An id past the tokenizer's vocabulary (the embedding table is padded) has no text.
  }
  return release();
}

std::string TextStream::finish() {
  if (stopped_) return {};
  held_ += decoder_.finish();
  std::string out = release();
  if (!stopped_) {
    out += held_;  // the stream ended: a partial stop string is just text
    held_.clear();
  }
  return out;
}

std::string TextStream::release() {
  // A complete stop string: emit what precedes the earliest one and stop.
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stop_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace tetra::server
