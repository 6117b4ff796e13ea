// A one-line progress display on stderr, redrawn in place when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tetra::cli {

class Progress {
 public:
  // `unit` names what update() counts ("tensors", "tokens"); bytes are shown only when a
  // count of them is given.
  explicit Progress(std::string label, std::string unit = "tensors");
  // Redraws at most every 100 ms (and never when stderr is not a terminal).
  void update(int64_t items, int64_t bytes = 0);
  // Prints the final line (always) and returns the seconds elapsed.
  double finish(int64_t items, int64_t bytes = 0);

 private:
  std::string line(int64_t items, int64_t bytes, double seconds) const;

  std::string label_, unit_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_;
};

std::string format_bytes(double bytes);  // "1.20 MB" (decimal units)
std::string format_count(double n);      // "1.23 M", "30.53 B": a count in plain units

}  // namespace tetra::cli
