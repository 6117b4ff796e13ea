#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace tetra::cli {

namespace {

// v in thousands steps: "12", "1.20 K", "3.40 M" ... with the given unit names.
std::string format_thousands(double v, const char* const (&units)[5], const char* sep) {
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s%s" : "%.0f%s%s", v, sep, units[u]);
  return buf;
}

}  // namespace

std::string format_bytes(double bytes) {
  static const char* const units[5] = {"B", "KB", "MB", "GB", "TB"};
  return format_thousands(bytes, units, " ");
}

std::string format_count(double n) {
  static const char* const units[5] = {"", "K", "M", "B", "T"};
  return format_thousands(n, units, n >= 1000 ? " " : "");
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
