// A one-line progress display on stderr, redrawn in place when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tetra::cli {

class Progress {
 public:
  explicit Progress(std::string label);
  // Redraws at most every 100 ms (and never when stderr is not a terminal).
  void update(int64_t items, int64_t bytes);
  // Prints the final line (always) and returns the seconds elapsed.
  double finish(int64_t items, int64_t bytes);

 private:
  std::string label_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_;
};

std::string format_bytes(double bytes);

}  // namespace tetra::cli
