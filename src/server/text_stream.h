// One choice's text as it streams: tokens in, text out, with stop strings matched across token
// boundaries. Text that might be the beginning of a stop string is held back until the next
// token settles it, and UTF-8 characters are never split (the incremental decoder releases only
// whole characters), so what is emitted is always a prefix of the final text.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/decoder.h"

namespace tetra::server {

class TextStream {
 public:
  TextStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stop, bool skip_special);

  // Adds a generated token; returns the text now safe to emit. After a stop string is found,
  // stopped() is true and further tokens are ignored.
  std::string push(int32_t token);
  // The end of generation: releases the held-back text (and repairs a cut character).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::string release();

  tok::IncrementalDecoder decoder_;
  std::vector<std::string> stop_;
  std::string held_;  // decoded but not yet emitted: may be the start of a stop string
  bool stopped_ = false;
};

}  // namespace tetra::server
