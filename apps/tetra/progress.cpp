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

Progress::Progress(std::string label)
    : label_(std::move(label)), tty_(isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()), last_(start_) {}

void Progress::update(int64_t items, int64_t bytes) {
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double s = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s: %lld tensors, %s, %s/s, %.1f s", label_.c_str(), (long long)items,
               format_bytes(double(bytes)).c_str(), format_bytes(s > 0 ? double(bytes) / s : 0.0).c_str(), s);
  std::fflush(stderr);
}

double Progress::finish(int64_t items, int64_t bytes) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "%s%s: %lld tensors, %s, %s/s, %.2f s\n", tty_ ? "\r" : "", label_.c_str(),
               (long long)items, format_bytes(double(bytes)).c_str(),
               format_bytes(s > 0 ? double(bytes) / s : 0.0).c_str(), s);
  return s;
}

}  // namespace tetra::cli
