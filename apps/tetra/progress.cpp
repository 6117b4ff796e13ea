#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace tetra::cli {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

std::string format_count(double n) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (n >= 1000 && u < 4) {
    n /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s" : "%.0f%s", n, units[u]);
  return buf;
}

Progress::Progress(std::string label, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), tty_(isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()), last_(start_) {}

// "loading m: 12 tensors, 1.20 MB, 3.40 MB/s, 0.35 s"; "evaluating: 900 tokens, 2570.0 tokens/s, 0.35 s"
std::string Progress::line(int64_t items, int64_t bytes, double s) const {
  char buf[256];
  if (bytes > 0)
    std::snprintf(buf, sizeof buf, "%s: %lld %s, %s, %s/s, %.2f s", label_.c_str(), (long long)items,
                  unit_.c_str(), format_bytes(double(bytes)).c_str(),
                  format_bytes(s > 0 ? double(bytes) / s : 0.0).c_str(), s);
  else
    std::snprintf(buf, sizeof buf, "%s: %lld %s, %.1f %s/s, %.2f s", label_.c_str(), (long long)items,
                  unit_.c_str(), s > 0 ? double(items) / s : 0.0, unit_.c_str(), s);
  return buf;
}

void Progress::update(int64_t items, int64_t bytes) {
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  std::fprintf(stderr, "\r%s", line(items, bytes, std::chrono::duration<double>(now - start_).count()).c_str());
  std::fflush(stderr);
}

double Progress::finish(int64_t items, int64_t bytes) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "%s%s\n", tty_ ? "\r" : "", line(items, bytes, s).c_str());
  return s;
}

}  // namespace tetra::cli
